/* Entry point of the `zinc` command: dispatches to the subcommands. */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "zinc/zinc.h"
#include "cli/cli.h"
#include "zn_build_config.h"
#if ZN_HAVE_MPI
#include <mpi.h>
#endif

static const zn_cli_cmd commands[] = {
    { "info", zn_cmd_info, "machine report: NUMA, memory, GPUs, NVMe, io_uring, O_DIRECT" },
    { "train", zn_cmd_train, "train a model with its state offloaded to cpu/nvme tiers" },
    { "plan", zn_cmd_plan, "place a model's training state into the tiers of a config" },
    { "eval", zn_cmd_eval, "mean next-token cross-entropy of an HF model over token data" },
    { "generate", zn_cmd_generate, "generate text from an HF model folder (and a LoRA adapter)" },
    { "chat", zn_cmd_chat, "talk with a model folder through its chat template" },
    { "prepare", zn_cmd_prepare, "text / chat jsonl to a token file with the model's tokenizer" },
    { "plot", zn_cmd_plot, "draw a run's --json-log as an SVG picture (loss, lr, tokens/s)" },
    { "export", zn_cmd_export, "write a checkpoint as a Hugging Face folder (or --verify it)" },
    { "bench", zn_cmd_bench, "offload bandwidth benchmarks (nvme, adam, pcie, ...)" },
    { "launch", zn_cmd_launch, "start a command on every slot of a DeepSpeed hostfile (ssh)" },
};

int zn_cli_fail(int rc, const char *what)
{
    const char *detail = zn_last_error();
    if (what && *what)
        fprintf(stderr, "zinc: error: %s: %s\n", what, *detail ? detail : zn_strerror(rc));
    else
        fprintf(stderr, "zinc: error: %s\n", *detail ? detail : zn_strerror(rc));
    return 1;
}

void zn_cli_end_job(int launcher_must_end, int code)
{
    if (!launcher_must_end)
        return;
    fflush(stdout);
    fflush(stderr);
#if ZN_HAVE_MPI
    /* ends every rank of the job (mpirun kills the others); does not return */
    MPI_Abort(MPI_COMM_WORLD, code ? (code < 0 ? (-code) & 0x7f : code) : 1);
#else
    (void)code;
#endif
}

/* Every command's SIGINT, SIGTERM, SIGHUP and SIGUSR1 until it installs its own (zinc
 * train stops its step and saves; zinc launch forwards them): the NVMe swap
 * files and run directories this process made go first (unlink and rmdir:
 * async-signal-safe), then the signal takes its default course, so nothing
 * a benchmark, an eval or a generation swapped to disk outlives it. */
static void on_signal(int sig)
{
    zn_swap_remove_all_now();
    signal(sig, SIG_DFL);
    raise(sig);
}

static void install_signals(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);  /* what mpirun passes on (zinc launch --launcher openmpi) */
}

static void usage(FILE *f)
{
    fprintf(f, "usage: zinc <command> [args]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-8s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "\n`zinc <command> --help` describes each one. "
               "Log level: ZINC_LOG=debug|info|warn|error.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("zinc %s\n", ZN_VERSION);
        return 0;
    }
    install_signals();
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name))
            return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "zinc: error: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
