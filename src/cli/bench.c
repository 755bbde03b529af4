#include <stdio.h>

#include "cli/cli.h"

int cli_info(int argc, char **argv) { (void)argc; (void)argv; return 1; }
int cli_bench(int argc, char **argv) { (void)argc; (void)argv; return 1; }
