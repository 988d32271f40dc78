/* cli/template: renders a chat template for a conversation and prints exactly
 * the resulting prompt (like llama-server's /apply-template), so templates can
 * be checked byte for byte against Python's jinja2. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static const char TEMPLATE_HELP[] =
    "usage: tokenloop template [-m FILE] [--template FILE.jinja] --messages FILE.json\n"
    "                          [--no-generation-prompt]\n"
    "\n"
    "Renders the chat template for a conversation and prints the prompt, nothing else.\n"
    "\n"
    "  -m, --model FILE        GGUF file giving the template and the BOS/EOS token text\n"
    "                          (a vocabulary-only file is enough; default as for run)\n"
    "      --template FILE     use this Jinja template instead of the file's own\n"
    "      --messages FILE     JSON: a list of {\"role\": ..., \"content\": ...}, or an object\n"
    "                          {\"messages\": [...], ...} whose other keys (tools, ...)\n"
    "                          become template variables ('-' for stdin)\n"
    "      --no-generation-prompt   add_generation_prompt = false (default true)\n"
    "\n"
    "Templates are rendered as Hugging Face transformers does (jinja2 sandbox,\n"
    "trim_blocks, lstrip_blocks, loop controls); see docs/CHAT.md for the supported\n"
    "subset. A template that calls raise_exception or uses an unsupported construct\n"
    "fails with its message (exit 1).\n";

int cmd_template(int argc, char **argv) {
    const char *model = NULL, *tpl_path = NULL, *msg_path = NULL;
    int add_gen = 1;
    cli_args p = cli_args_start(argc, argv);
    const char *a;
    int more;
    while ((more = cli_next(&p, &a)) > 0) {
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(TEMPLATE_HELP, stdout);
            return 0;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            if (!(model = cli_arg(&p))) return EXIT_USAGE;
        } else if (!strcmp(a, "--template")) {
            if (!(tpl_path = cli_arg(&p))) return EXIT_USAGE;
        } else if (!strcmp(a, "--messages")) {
            if (!(msg_path = cli_arg(&p))) return EXIT_USAGE;
        } else if (!strcmp(a, "--no-generation-prompt")) {
            add_gen = 0;
        } else {
            cli_error("unknown option '%s' (try 'tokenloop template --help')", a);
            return EXIT_USAGE;
        }
    }
    if (more < 0) return EXIT_USAGE;
    if (!msg_path) {
        cli_error("--messages FILE is required (try 'tokenloop template --help')");
        return EXIT_USAGE;
    }
    char buf[4096];
    const char *path = model ? model : cli_default_model(buf, sizeof buf);
    tl_error err = {0};
    tl_model *m = NULL;
    if (tl_model_load_vocab(path, &m, &err)) {
        cli_error("%s: %s", path, err.msg);
        return 1;
    }
    size_t mlen = 0, tlen = 0;
    char *tpl = NULL, *msgs = cli_read_file(msg_path, &mlen), *out = NULL;
    int rc = 1;
    if (msgs && (!tpl_path || (tpl = cli_read_file(tpl_path, &tlen)))) {
        if (!tpl && !tl_model_chat_template(m)) {
            cli_error("%s has no chat template; give one with --template", path);
        } else {
            size_t olen = 0;
            if (tl_chat_apply(m, tpl, msgs, mlen, add_gen, &out, &olen, &err)) {
                cli_tl_error(&err);
            } else {
                fwrite(out, 1, olen, stdout);
                rc = fflush(stdout) ? 1 : 0;
            }
        }
    }
    tl_free(out);
    free(tpl);
    free(msgs);
    tl_model_free(m);
    return rc;
}
