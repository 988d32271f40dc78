/* server/loop: the live loop's hub. The scheduler publishes each trace
 * record (a JSON line, docs/TRACE.md) here; /v1/loop readers follow them as
 * server-sent events. Readers that fall behind skip ahead: the scheduler
 * never waits for a page. */
#ifndef TL_SERVER_LOOP_H
#define TL_SERVER_LOOP_H

#include <stddef.h>
#include <stdint.h>

#include "api.h"

typedef struct srv_loop srv_loop;

int srv_loop_new(int cap, srv_loop **out);
void srv_loop_free(srv_loop *l);
/* Whether anyone follows the loop now (the scheduler traces only then). */
int srv_loop_watched(srv_loop *l);
/* Copies one record (without newline). line NULL: a record was lost (the
 * publisher had no memory for it); readers get a gap for it in its place,
 * as for one they fell too far behind to read. */
void srv_loop_publish(srv_loop *l, const char *line, size_t n);
/* A reader: joins at the newest record; leave when done. */
uint64_t srv_loop_join(srv_loop *l);
void srv_loop_leave(srv_loop *l);
/* Appends the records from *next on to out as SSE events (waiting up to
 * timeout_ms for one); where records were lost or overwritten before this
 * reader got them, an "event: gap" whose data is how many it missed. Returns
 * how many events it wrote, -1 out of memory. */
int srv_loop_read(srv_loop *l, uint64_t *next, api_buf *out, int timeout_ms);
/* Wakes every reader (at shutdown). */
void srv_loop_close(srv_loop *l);
int srv_loop_closed(srv_loop *l);

#endif
