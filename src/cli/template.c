/* template subcommand (the chat template renderer lands in its own change). */
#include <stdio.h>

#include "cli/cli.h"

int cli_template(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "pagoda template: chat templates are not built yet\n");
    return 1;
}
