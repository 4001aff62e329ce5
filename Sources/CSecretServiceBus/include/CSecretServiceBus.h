/*
 * CSecretServiceBus: the thin C wall between CofferSecretService and sd-bus (libsystemd) for the
 * Secret Service front end (issue #26). sd-bus's reading and replying functions take C varargs,
 * which Swift cannot call: each function here reads or writes one fixed message signature. All
 * marshalling is sd-bus's; nothing here parses D-Bus bytes. Only CofferSecretService imports it.
 *
 * Calls from the bus (method calls, NameOwnerChanged) go to the handlers given to
 * ssb_bus_serve_service and ssb_add_session, with the message and the handlers' userdata; a handler answers with one of
 * the ssb_reply_* functions and returns what it returned.
 */
#ifndef CSECRETSERVICEBUS_H
#define CSECRETSERVICEBUS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sd_bus ssb_bus;
typedef struct sd_bus_message ssb_message;
typedef struct sd_bus_slot ssb_slot;

/** What OpenSession's input variant held. */
#define SSB_INPUT_STRING 1
#define SSB_INPUT_BYTES 2
#define SSB_INPUT_OTHER 3

/** What ssb_request_name found. */
#define SSB_NAME_OWNED 0
#define SSB_NAME_TAKEN 1

typedef struct ssb_handlers {
    /** Service.OpenSession(s algorithm, v input). */
    int (*open_session)(ssb_message *m, void *userdata);
    /** Session.Close() on the object the message names. */
    int (*close_session)(ssb_message *m, void *userdata);
    /** NameOwnerChanged(name, old_owner, new_owner) from the bus. */
    void (*name_owner_changed)(const char *name, const char *old_owner, const char *new_owner, void *userdata);
    void *userdata;
} ssb_handlers;

/** Connects to the session bus (DBUS_SESSION_BUS_ADDRESS, else the user's default); a negative errno on failure. */
int ssb_bus_open_session(ssb_bus **bus);
void ssb_bus_close(ssb_bus *bus);
/** Serves the Service interface at `path` and subscribes to NameOwnerChanged (`handlers` kept by pointer: they must outlive the bus). */
int ssb_bus_serve_service(ssb_bus *bus, const char *path, const ssb_handlers *handlers);
/** Requests `name` without replacing its owner and without queueing: SSB_NAME_OWNED, SSB_NAME_TAKEN, or a negative errno. */
int ssb_request_name(ssb_bus *bus, const char *name);
/** Serves the Session interface at `path`; the object goes when *slot is released with ssb_slot_release. */
int ssb_add_session(ssb_bus *bus, const char *path, const ssb_handlers *handlers, ssb_slot **slot);
void ssb_slot_release(ssb_slot *slot);
/** Processes messages until an error (a negative errno) or the bus closes (0). */
int ssb_bus_run(ssb_bus *bus);

/** The message's sender (a unique name) and object path, or NULL. */
const char *ssb_message_sender(ssb_message *m);
const char *ssb_message_path(ssb_message *m);

/**
 * Reads OpenSession's arguments: the algorithm, and the input variant's kind (SSB_INPUT_*); for
 * SSB_INPUT_BYTES *input and *size are the bytes (valid while the message is). Negative errno if
 * the message is not (s, v).
 */
int ssb_read_open_session(ssb_message *m, const char **algorithm, int *kind, const void **input, size_t *size);
/** Replies (v output, o path): the output variant an empty string ("s") when `as_bytes` is 0, else "ay". */
int ssb_reply_open_session(ssb_message *m, int as_bytes, const void *output, size_t size, const char *path);
int ssb_reply_empty(ssb_message *m);
int ssb_reply_error(ssb_message *m, const char *name, const char *text);

/**
 * org.freedesktop.DBus.GetConnectionCredentials(sender): *pid the ProcessID (0 if absent), *pidfd a
 * duplicate of ProcessFD when the bus offers one (else -1; the caller closes it). Negative errno on failure.
 */
int ssb_connection_credentials(ssb_bus *bus, const char *sender, uint32_t *pid, int *pidfd);

#ifdef __cplusplus
}
#endif
#endif
