/* `zinc prepare`: text to a token file (version 2: ids, loss mask, document
 * ends) with the model's own tokenizer and chat template. The work is
 * Python's (the HF tokenizers library, Jinja chat templates):
 * scripts/zinc_prepare.py, run by the project's virtual environment
 * (.venv, made by `scripts/setup.sh venv`), or by ZINC_PYTHON. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/cli.h"

#ifndef ZN_SOURCE_ROOT
#define ZN_SOURCE_ROOT "."
#endif

int zn_cmd_prepare(int argc, char **argv)
{
    char script[4096], py[4096];
    snprintf(script, sizeof script, "%s/scripts/zinc_prepare.py", ZN_SOURCE_ROOT);
    const char *env = getenv("ZINC_PYTHON");
    if (env && *env)
        snprintf(py, sizeof py, "%s", env);
    else
        snprintf(py, sizeof py, "%s/.venv/bin/python", ZN_SOURCE_ROOT);
    if (access(script, R_OK)) {
        fprintf(stderr, "zinc: error: prepare: %s: %s (zinc prepare runs from its source "
                "tree)\n", script, strerror(errno));
        return 1;
    }
    if (access(py, X_OK)) {
        fprintf(stderr, "zinc: error: prepare: %s: %s: run `bash %s/scripts/setup.sh venv` "
                "(a virtual environment with tokenizers and jinja2), or set ZINC_PYTHON to a "
                "python that has them\n", py, strerror(errno), ZN_SOURCE_ROOT);
        return 1;
    }
    char **args = calloc((size_t)argc + 2, sizeof *args);
    if (!args) {
        fprintf(stderr, "zinc: error: prepare: out of memory\n");
        return 1;
    }
    args[0] = py;
    args[1] = script;
    for (int i = 1; i < argc; i++)
        args[i + 1] = argv[i];
    fflush(NULL);
    execv(py, args);
    fprintf(stderr, "zinc: error: prepare: exec %s: %s\n", py, strerror(errno));
    free(args);
    return 1;
}

int zn_cli_run_prepare(const char *const *args, int n)
{
    char script[4096], py[4096];
    snprintf(script, sizeof script, "%s/scripts/zinc_prepare.py", ZN_SOURCE_ROOT);
    const char *env = getenv("ZINC_PYTHON");
    snprintf(py, sizeof py, "%s", env && *env ? env : ZN_SOURCE_ROOT "/.venv/bin/python");
    if (access(py, X_OK)) {
        fprintf(stderr, "zinc: error: %s: %s: preparing a recipe's data needs the tokenizer's "
                "virtual environment (`bash %s/scripts/setup.sh venv`, or ZINC_PYTHON)\n", py,
                strerror(errno), ZN_SOURCE_ROOT);
        return 1;
    }
    const char **argv = calloc((size_t)n + 3, sizeof *argv);
    if (!argv)
        return 1;
    argv[0] = py;
    argv[1] = script;
    for (int i = 0; i < n; i++)
        argv[i + 2] = args[i];
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        free(argv);
        fprintf(stderr, "zinc: error: fork: %s\n", strerror(errno));
        return 1;
    }
    if (!pid) {
        execv(py, (char *const *)argv);
        fprintf(stderr, "zinc: error: exec %s: %s\n", py, strerror(errno));
        _exit(127);
    }
    free(argv);
    int st;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR)
            return 1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
}
