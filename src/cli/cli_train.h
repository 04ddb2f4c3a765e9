/* Shared by `zinc train` and `zinc bench train`: a config turned into a
 * running trainer (Llama adapter, budgets, plan, data loader). */
#ifndef ZN_CLI_TRAIN_H
#define ZN_CLI_TRAIN_H

#include "zinc/config.h"
#include "zinc/model.h"
#include "zinc/tokens.h"
#include "zinc/train.h"

typedef struct {
    zn_train_llama *llama;
    zn_trainer *tr;
    zn_tokens *data;
    zn_loader *loader;
    int32_t *ids, *tgts;
    zn_model_dims dims;
    uint64_t params;
} zn_cli_train_session;

/* The embedded default config (examples/tiny.json's text). */
const char *zn_cli_default_config(void);
/* Resolves batch keys, dims, budgets and the plan input, then creates the
 * trainer (which refuses an infeasible plan with its explanation) and the
 * data. Returns 0 or a status with zn_last_error() set. */
int zn_cli_train_session_open(zn_cli_train_session *ts, zn_config *cfg, int record_trace);
/* One optimizer step on the loader's batch `step`. */
int zn_cli_train_session_step(zn_cli_train_session *ts, uint64_t step, zn_train_step_info *info);
void zn_cli_train_session_close(zn_cli_train_session *ts);

#endif
