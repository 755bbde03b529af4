/*
 * cli: the subcommands of the pagoda binary. Each takes the arguments after its name
 * (argv[0] is the subcommand) and returns the process exit status.
 */
#ifndef PAGODA_CLI_CLI_H
#define PAGODA_CLI_CLI_H

int cli_info(int argc, char **argv);
int cli_generate(int argc, char **argv);
int cli_score(int argc, char **argv);
/** `pagoda perplexity`: --model DIR --file F [--ctx N] [--kl-base D] [--json] (perplexity.c). */
int cli_perplexity(int argc, char **argv);
/** `pagoda embed`: embedding vectors of texts or token-id prompts. */
int cli_embed(int argc, char **argv);
int cli_bench(int argc, char **argv);
int cli_tokenize(int argc, char **argv);
int cli_detokenize(int argc, char **argv);
/** `pagoda bench tokenize`: argv[0] is "tokenize"; --model DIR --text-file F [--min-seconds S]. */
int cli_bench_tokenize(int argc, char **argv);
int cli_bench_throughput(int argc, char **argv);
int cli_bench_matmul(int argc, char **argv);
/** `pagoda bench grammar`: mask time per step of constrained decoding (--model DIR). */
int cli_bench_grammar(int argc, char **argv);
/** `pagoda bench make-model`: argv[0] is "make-model"; a random-weight checkpoint. */
int cli_bench_make_model(int argc, char **argv);
int cli_template(int argc, char **argv);
/** `pagoda convert`: a checkpoint folder in another weight format (cli/convert.h). */
int cli_convert(int argc, char **argv);
/** `pagoda serve`: the HTTP server; returns after SIGTERM / SIGINT. */
int cli_serve(int argc, char **argv);

#endif
