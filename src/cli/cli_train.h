/* Shared by `zinc train` and `zinc bench train`: a config turned into a
 * running trainer (Llama adapter, budgets, plan, data loader). */
#ifndef ZN_CLI_TRAIN_H
#define ZN_CLI_TRAIN_H

#include "zinc/comm.h"
#include "zinc/config.h"
#include "zinc/model.h"
#include "zinc/tokens.h"
#include "zinc/train.h"

typedef struct {
    zn_train_llama *llama;
    zn_trainer *tr;
    zn_tokens *data;
    zn_loader *loader;
    int32_t *ids, *tgts, *pos;
    zn_model_dims dims;
    uint64_t params;
    /* the ranks (mpirun / srun / torchrun launch; world 1 otherwise) */
    zn_comm *comm;
    int rank, world;
    size_t rank_tokens;  /* ids of one rank's micro-batches per step */
    zn_tokens *eval_data;      /* data.eval_path, or NULL */
    zn_loader *eval_loader;    /* its windows in file order, the global batch */
    int32_t *eval_ids, *eval_tgts, *eval_pos;
    char weights[4400];  /* where the initial weights came from, for the header */
    char lora[4400];     /* LoRA: the adapters' line for the header ("" none) */
    double load_s;       /* seconds spent creating the trainer (weights written home) */
    uint64_t load_bytes; /* checkpoint bytes read */
} zn_cli_train_session;

/* zn_cli_train_session_open flags */
#define ZN_CLI_TRACE 1       /* record a trace */
#define ZN_CLI_NO_WEIGHTS 2  /* a checkpoint will overwrite the state: do not
                                read model.path's weights (seeded init) */

/* The embedded default config (examples/tiny.json's text). */
const char *zn_cli_default_config(void);
/* Joins the job's ranks (a communicator from the launch environment: world
 * 1 when not launched by mpirun / srun / torchrun), resolves batch keys,
 * dims, budgets ("auto" ones shared among the ranks of one host) and the
 * plan input, then creates the trainer (which refuses an infeasible plan with
 * its explanation) and the data (every rank reads the global batch and
 * trains on its slice). The initial weights are model.path's safetensors
 * (model.init "weights", the default with a path: a folder without weights
 * is an error) or the seeded init; ts->weights says which. Returns 0 or a status with zn_last_error() set; on
 * failure only the communicator is left: report, then _abort and _close. */
int zn_cli_train_session_open(zn_cli_train_session *ts, zn_config *cfg, int flags);
/* The mean loss over data.eval_path's targets (train.eval_batches global
 * batches, 0 = the whole file) on the current parameters, all ranks
 * together; *n_targets what it averaged. */
int zn_cli_train_session_eval(zn_cli_train_session *ts, const zn_config *cfg, double *mean,
                              uint64_t *n_targets);
/* One optimizer step on the loader's batch `step`. */
int zn_cli_train_session_step(zn_cli_train_session *ts, uint64_t step, zn_train_step_info *info);
void zn_cli_train_session_close(zn_cli_train_session *ts);
/* After a failure in a job of several ranks: ends the other ranks too (MPI:
 * MPI_Abort, which does not return). No-op for one rank. */
void zn_cli_train_session_abort(zn_cli_train_session *ts, int code);

#endif
