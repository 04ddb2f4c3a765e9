#include "cli/cli.h"
int zn_cmd_plan(int argc, char **argv) { (void)argc; (void)argv; return 0; }
