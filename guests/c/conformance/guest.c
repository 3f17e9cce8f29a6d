// The conformance guest in C: the same behaviours as every language's conformance guest.
//
// The route's `mode` config value picks the behaviour:
// - `upper` (default): log a line, output the payload upper-cased on `<subject>.done` with
//   header `lang`;
// - `reject`: reject a payload that is not a JSON object, echo one that is;
// - `retry`: ask for a retry until attempt `succeed_on_attempt` (config, default 2), then
//   output `succeeded on attempt N`.
//
// Everything returned is allocated with malloc: the generated bindings free it after the host
// has copied it out.

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "handler_guest.h"

static const char *LANG = "c";

typedef handler_guest_string_t string_t;

// The value of config `key` as a NUL-terminated string, or NULL when unset. Caller frees.
static char *config_get(const char *key) {
  string_t k, value;
  handler_guest_string_set(&k, key);
  if (!dedup_handler_config_get(&k, &value)) {
    return NULL;
  }
  char *s = malloc(value.len + 1);
  memcpy(s, value.ptr, value.len);
  s[value.len] = '\0';
  handler_guest_string_free(&value);
  return s;
}

// Fills `ret` with one output on `<subject>.done` carrying `payload` (taken over).
static void one_output(const exports_dedup_handler_handler_event_t *event, uint8_t *payload,
                       size_t len, exports_dedup_handler_handler_list_output_t *ret) {
  dedup_handler_types_output_t *out = calloc(1, sizeof *out);
  size_t subject_len = event->subject.len + strlen(".done");
  out->subject.ptr = malloc(subject_len);
  out->subject.len = subject_len;
  memcpy(out->subject.ptr, event->subject.ptr, event->subject.len);
  memcpy(out->subject.ptr + event->subject.len, ".done", strlen(".done"));
  out->payload.ptr = payload;
  out->payload.len = len;
  out->headers.ptr = calloc(1, sizeof(dedup_handler_types_header_t));
  out->headers.len = 1;
  handler_guest_string_dup(&out->headers.ptr[0].name, "lang");
  handler_guest_string_dup(&out->headers.ptr[0].value, LANG);
  ret->ptr = out;
  ret->len = 1;
}

static uint8_t *copy_bytes(const uint8_t *bytes, size_t len) {
  uint8_t *copy = malloc(len ? len : 1);
  memcpy(copy, bytes, len);
  return copy;
}

static bool reject(exports_dedup_handler_handler_failure_t *err, const char *reason) {
  err->tag = DEDUP_HANDLER_TYPES_FAILURE_REJECT;
  handler_guest_string_dup(&err->val.reject, reason);
  return false;
}

static bool upper(exports_dedup_handler_handler_event_t *event,
                  exports_dedup_handler_handler_list_output_t *ret) {
  char bytes[32];
  snprintf(bytes, sizeof bytes, "%zu", event->payload.len);
  handler_guest_tuple2_string_string_t field;
  handler_guest_string_set(&field.f0, "bytes");
  handler_guest_string_set(&field.f1, bytes);
  handler_guest_list_tuple2_string_string_t fields = {&field, 1};
  string_t message;
  handler_guest_string_set(&message, "transforming");
  dedup_handler_log_log(DEDUP_HANDLER_LOG_LEVEL_INFO, &message, &fields);

  uint8_t *payload = copy_bytes(event->payload.ptr, event->payload.len);
  for (size_t i = 0; i < event->payload.len; i++) {
    payload[i] = (uint8_t)toupper(payload[i]);
  }
  one_output(event, payload, event->payload.len, ret);
  return true;
}

static bool json_only(exports_dedup_handler_handler_event_t *event,
                      exports_dedup_handler_handler_list_output_t *ret,
                      exports_dedup_handler_handler_failure_t *err) {
  size_t i = 0;
  while (i < event->payload.len && isspace(event->payload.ptr[i])) {
    i++;
  }
  if (i == event->payload.len || event->payload.ptr[i] != '{') {
    return reject(err, "malformed: expected a JSON object");
  }
  one_output(event, copy_bytes(event->payload.ptr, event->payload.len), event->payload.len, ret);
  return true;
}

static bool retry_until(exports_dedup_handler_handler_event_t *event,
                        exports_dedup_handler_handler_list_output_t *ret,
                        exports_dedup_handler_handler_failure_t *err) {
  char *wanted_text = config_get("succeed_on_attempt");
  unsigned wanted = wanted_text ? (unsigned)strtoul(wanted_text, NULL, 10) : 2;
  free(wanted_text);
  char text[64];
  if (event->attempt < wanted) {
    snprintf(text, sizeof text, "attempt %u of %u: not yet", event->attempt, wanted);
    err->tag = DEDUP_HANDLER_TYPES_FAILURE_RETRY;
    handler_guest_string_dup(&err->val.retry.reason, text);
    err->val.retry.delay_ms.is_some = true;
    err->val.retry.delay_ms.val = 10;
    return false;
  }
  int len = snprintf(text, sizeof text, "succeeded on attempt %u", event->attempt);
  one_output(event, copy_bytes((const uint8_t *)text, (size_t)len), (size_t)len, ret);
  return true;
}

bool exports_dedup_handler_handler_handle(exports_dedup_handler_handler_event_t *event,
                                          exports_dedup_handler_handler_list_output_t *ret,
                                          exports_dedup_handler_handler_failure_t *err) {
  char *mode = config_get("mode");
  bool ok;
  if (mode == NULL || strcmp(mode, "upper") == 0) {
    ok = upper(event, ret);
  } else if (strcmp(mode, "reject") == 0) {
    ok = json_only(event, ret, err);
  } else if (strcmp(mode, "retry") == 0) {
    ok = retry_until(event, ret, err);
  } else {
    char reason[128];
    snprintf(reason, sizeof reason, "unknown mode `%s`", mode);
    ok = reject(err, reason);
  }
  free(mode);
  exports_dedup_handler_handler_event_free(event);
  return ok;
}
