/* server/tools: OpenAI tool calls (see tools.c for the format). */
#ifndef TL_SERVER_TOOLS_H
#define TL_SERVER_TOOLS_H

#include <jansson.h>

#include "tokenloop.h"
#include "wire.h"

enum { TOOLS_NONE = 0, TOOLS_AUTO = 1, TOOLS_REQUIRED = 2 };
/* Call formats (see tools.c). */
enum { TOOLS_HERMES = 0, TOOLS_LLAMA3 = 1, TOOLS_MISTRAL = 2, TOOLS_HARMONY = 3, TOOLS_QWEN_XML = 4, TOOLS_GEMMA4 = 5 };

/* A request's tools (borrowed from its JSON body). */
typedef struct tools_req {
    json_t *tools;    /* the array, or NULL */
    int mode;         /* TOOLS_* (none without tools) */
    const char *only; /* a named function (mode REQUIRED), or NULL */
    int parallel;     /* parallel_tool_calls */
} tools_req;

/* tools, tool_choice and parallel_tool_calls, checked. 0 or -1 with e. */
int tools_parse(json_t *root, tools_req *t, api_err *e);
/* The format the model's template teaches (native: the template renders the
 * tools itself); Hermes otherwise. */
int tools_format(const char *tmpl, int native);
/* Whether tmpl (may be NULL) is Gemma 4's: it writes calls as
 * <|tool_call>call:NAME{...}<tool_call|> (and thinks only when asked,
 * with its enable_thinking variable). */
int tools_gemma4(const char *tmpl);
/* Whether it is the older Gemma 4 template, which renders tool results
 * only from the calling message's tool_responses, not from role "tool"
 * messages (llama.cpp rewrites the history for it, and so does prompt.c). */
int tools_gemma4_legacy(const char *tmpl);
/* The text that opens the calls: under auto, the calls' grammar starts there. */
const char *tools_trigger(int fmt);
/* Whether the reply's text must show control tokens (Mistral's [TOOL_CALLS]). */
int tools_special_text(int fmt);
/* Whether calls only open the reply (Llama 3's: the whole reply is the call). */
int tools_at_start(int fmt);
/* What a streamed reply must put back before held text when a call never
 * completes (the open text, if the stream dropped it). */
const char *tools_lost_open(int fmt);
/* The system text that lists the tools for templates without tool support. */
char *tools_system_text(json_t *tools);
/* The grammar of the calls t allows: the tags around JSON whose arguments
 * validate against each function's parameters. */
int tools_grammar(const tools_req *t, int fmt, tl_grammar **out, tl_error *err);
/* One harmony call (tl_harmony_feed's piece) as OpenAI's {id, type, function}
 * (with "index" if index >= 0): the arguments compacted when they parse as
 * JSON, "{}" when empty, else as written. */
json_t *tools_harmony_call(const char *name, const char *args, size_t n, int k, int index, const char *req_id);
/* Qwen3.5's XML calls write string parameters as raw text and the others as
 * JSON: {function name: [its string parameters]} from the tools, or NULL. */
json_t *tools_string_params(json_t *tools);
/* A whole reply: the calls in it (NULL if none) and the length of the
 * content before them. strs: tools_string_params' (TOOLS_QWEN_XML), or NULL. */
json_t *tools_split(int fmt, const char *text, size_t n, const char *req_id, json_t *strs, size_t *content_len);

/* A streamed reply (tools_stream_st, in api.h): text is held back while it
 * may be the start of a tag; each call is emitted once its block is
 * complete, with its "index". Adds text; appends content that is safe to send to content and finished
 * calls (with their "index") to calls. */
/* A streamed reply's tool calls (server/tools.c). */
typedef struct tools_stream_st {
    api_buf hold;
    int in_call, seen_call, n_calls;
    int plain; /* the reply has shown it holds no calls (a format whose calls open it) */
} tools_stream_st;

int tools_stream(tools_stream_st *s, int fmt, const char *text, size_t n, const char *req_id, json_t *strs,
                 api_buf *content, json_t *calls);

#endif
