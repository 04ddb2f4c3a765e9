#include "cli/cli.h"
int zn_cmd_info(int argc, char **argv) { (void)argc; (void)argv; return 0; }
