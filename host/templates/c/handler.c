// {{name}}: a dedup-host handler. A JSON object payload is greeted onto `<subject>.done`;
// anything else is rejected.
//
// `handler_guest.h` is generated from wit/ by `dedup-host build` (wit-bindgen c). Everything
// returned is allocated with malloc: the generated bindings free it after the host has copied
// it out.
//
// Outbound HTTP (a route granting `[routes.http]`) needs bindings for a world that also
// imports `wasi:http/outgoing-handler`, which this project's build does not generate; the
// Rust, Python and JavaScript templates end with an example call.

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "handler_guest.h"

typedef handler_guest_string_t string_t;

// A growable byte buffer for the output payload.
typedef struct {
  uint8_t *ptr;
  size_t len, cap;
} buffer_t;

static void append(buffer_t *b, const void *bytes, size_t len) {
  if (b->len + len > b->cap) {
    b->cap = (b->len + len) * 2;
    b->ptr = realloc(b->ptr, b->cap);
  }
  memcpy(b->ptr + b->len, bytes, len);
  b->len += len;
}

static void append_str(buffer_t *b, const char *s) { append(b, s, strlen(s)); }

// Appends `s` as a JSON string, quotes included.
static void append_json_string(buffer_t *b, const uint8_t *s, size_t len) {
  append_str(b, "\"");
  for (size_t i = 0; i < len; i++) {
    char escaped[8];
    if (s[i] == '"' || s[i] == '\\') {
      snprintf(escaped, sizeof escaped, "\\%c", s[i]);
      append_str(b, escaped);
    } else if (s[i] < 0x20) {
      snprintf(escaped, sizeof escaped, "\\u%04x", s[i]);
      append_str(b, escaped);
    } else {
      append(b, &s[i], 1);
    }
  }
  append_str(b, "\"");
}

// True when the payload looks like a JSON object: `{` ... `}` around optional white space.
// (A full parser is one #include away; the host treats a malformed object the same way.)
static bool is_json_object(const uint8_t *p, size_t len) {
  size_t start = 0, end = len;
  while (start < end && isspace(p[start])) start++;
  while (end > start && isspace(p[end - 1])) end--;
  return end - start >= 2 && p[start] == '{' && p[end - 1] == '}';
}

static bool reject(exports_dedup_handler_handler_failure_t *err, const char *reason) {
  err->tag = DEDUP_HANDLER_TYPES_FAILURE_REJECT;
  handler_guest_string_dup(&err->val.reject, reason);
  return false;
}

bool exports_dedup_handler_handler_handle(exports_dedup_handler_handler_event_t *event,
                                          exports_dedup_handler_handler_list_output_t *ret,
                                          exports_dedup_handler_handler_failure_t *err) {
  // Input that will never work is rejected: dead-lettered, not retried.
  if (!is_json_object(event->payload.ptr, event->payload.len)) {
    exports_dedup_handler_handler_event_free(event);
    return reject(err, "malformed: expected a JSON object");
  }

  string_t key, greeting;
  handler_guest_string_set(&key, "greeting");
  bool configured = dedup_handler_config_get(&key, &greeting);
  if (!configured) {
    handler_guest_string_set(&greeting, "hello");
  }

  handler_guest_tuple2_string_string_t fields[2];
  handler_guest_string_set(&fields[0].f0, "key");
  fields[0].f1 = event->key;
  handler_guest_string_set(&fields[1].f0, "greeting");
  fields[1].f1 = greeting;
  handler_guest_list_tuple2_string_string_t list = {fields, 2};
  string_t message;
  handler_guest_string_set(&message, "greeting");
  dedup_handler_log_log(DEDUP_HANDLER_LOG_LEVEL_INFO, &message, &list);

  buffer_t payload = {0};
  append_str(&payload, "{\"greeting\":");
  append_json_string(&payload, greeting.ptr, greeting.len);
  append_str(&payload, ",\"key\":");
  append_json_string(&payload, event->key.ptr, event->key.len);
  append_str(&payload, ",\"event\":");
  append(&payload, event->payload.ptr, event->payload.len);
  append_str(&payload, "}");
  if (configured) {
    handler_guest_string_free(&greeting);
  }

  dedup_handler_types_output_t *out = calloc(1, sizeof *out);
  size_t subject_len = event->subject.len + strlen(".done");
  out->subject.ptr = malloc(subject_len);
  out->subject.len = subject_len;
  memcpy(out->subject.ptr, event->subject.ptr, event->subject.len);
  memcpy(out->subject.ptr + event->subject.len, ".done", strlen(".done"));
  out->payload.ptr = payload.ptr;
  out->payload.len = payload.len;
  out->headers.ptr = calloc(1, sizeof(dedup_handler_types_header_t));
  out->headers.len = 1;
  handler_guest_string_dup(&out->headers.ptr[0].name, "content-type");
  handler_guest_string_dup(&out->headers.ptr[0].value, "application/json");
  ret->ptr = out;
  ret->len = 1;
  exports_dedup_handler_handler_event_free(event);
  return true;
}
