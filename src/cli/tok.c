/* tokenize / detokenize subcommands (the tokenizer lands in its own change). */
#include <stdio.h>

#include "cli/cli.h"

int cli_tokenize(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "pagoda tokenize: the tokenizer is not built yet\n");
    return 1;
}

int cli_detokenize(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "pagoda detokenize: the tokenizer is not built yet\n");
    return 1;
}
