/* pagoda: the command-line entry point; each subcommand lives in src/cli/. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

static const struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *help;
} commands[] = {
    {"serve", cli_serve, "serve the OpenAI and Anthropic HTTP APIs"},
    {"info", cli_info, "describe a model folder"},
    {"generate", cli_generate, "generate tokens from a prompt"},
    {"score", cli_score, "log-probabilities of a prompt's tokens"},
    {"perplexity", cli_perplexity, "perplexity of a text file (KV cache formats compared)"},
    {"embed", cli_embed, "embedding vectors of texts or token ids"},
    {"tokenize", cli_tokenize, "text to token ids"},
    {"detokenize", cli_detokenize, "token ids to text"},
    {"template", cli_template, "render a chat template"},
    {"convert", cli_convert, "rewrite a checkpoint in another weight format"},
    {"bench", cli_bench, "benchmarks: make-model, decode, tokenize"},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: pagoda <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-12s %s\n", commands[i].name, commands[i].help);
    fprintf(f, "\nRun 'pagoda <command> --help' for a command's options.\n");
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
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "pagoda: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
