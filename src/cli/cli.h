/* The `zinc` command: one function per subcommand, each taking the argv that
 * follows its name (argv[0] is the subcommand's name). A subcommand returns
 * the process exit code: 0 success, 1 failure (the error already printed),
 * 2 bad usage. */
#ifndef ZN_CLI_H
#define ZN_CLI_H

#include <stdio.h>

typedef struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} zn_cli_cmd;

/* Prints "zinc: error: <what>: <zn_last_error() or zn_strerror(rc)>" and
 * returns 1. */
int zn_cli_fail(int rc, const char *what);

/* Top-level commands. */
int zn_cmd_info(int argc, char **argv);
int zn_cmd_plan(int argc, char **argv);
int zn_cmd_bench(int argc, char **argv);

/* `zinc bench <what>` subcommands (bench.c holds the table). */

#endif
