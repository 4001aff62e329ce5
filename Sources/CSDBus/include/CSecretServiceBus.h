/*
 * CSecretServiceBus (in the CSDBus target): the thin C wall between CofferSecretService and sd-bus
 * (libsystemd) for the Secret Service front end (issue #26). sd-bus's reading and replying functions take C varargs,
 * which Swift cannot call: each function here reads or writes one fixed message signature. All
 * marshalling is sd-bus's; nothing here parses D-Bus bytes. Only CofferSecretService calls it
 * (CSDBus.h has the wall's rule).
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
/** An sd_bus_error (anonymous in sd-bus.h, so opaque here). */
typedef struct ssb_error ssb_error;

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
    /** Every other method of the Service, Collection, Item and Prompt interfaces (ssb_message_interface
     *  and ssb_message_member name it; sd-bus has checked the signature against the vtable). */
    int (*method)(ssb_message *m, void *userdata);
    /** Reads property `property` of `interface` at `path` for the sender of `call` (the message being
     *  served): appends the value, of the vtable's signature, to `reply` (ssb_append_*), or sets `error`
     *  (ssb_error_set) and returns its negative errno. */
    int (*get_property)(ssb_message *call, const char *path, const char *interface, const char *property,
                        ssb_message *reply, ssb_error *error, void *userdata);
    /** Writes property `property`: `value` is positioned at the value (ssb_read_*). */
    int (*set_property)(ssb_message *call, const char *path, const char *interface, const char *property,
                        ssb_message *value, ssb_error *error, void *userdata);
    /** Whether `path` may hold an object with `interface` (1) or not (0), for the fallback vtables.
     *  `introspecting` is 1 when the message being served is an Introspect call (which lists what
     *  exists), 0 for any other (which must reach a handler to be answered, NoSuchObject included). */
    int (*find)(const char *path, const char *interface, int introspecting, void *userdata);
    /** The object paths below `prefix` the sender of `call` (NULL outside a call) sees, for
     *  introspection: a NULL-terminated array of malloc'ed strings in a malloc'ed array, or NULL. */
    char **(*enumerate)(ssb_message *call, const char *prefix, void *userdata);
    void *userdata;
} ssb_handlers;

/** Connects to the session bus (DBUS_SESSION_BUS_ADDRESS, else the user's default); a negative errno on failure. */
int ssb_bus_open_session(ssb_bus **bus);
void ssb_bus_close(ssb_bus *bus);
/** Serves the Service interface at `path` and subscribes to NameOwnerChanged (`handlers` kept by pointer: they must outlive the bus). */
int ssb_bus_serve_service(ssb_bus *bus, const char *path, const ssb_handlers *handlers);
/**
 * Serves the Collection and Item interfaces below `collections` (fallback vtables: an object is a
 * path handlers->find accepts, none is registered per item) and the Collection interface below
 * `aliases`, the Prompt interface below `prompts`, the Item interfaces below `references` (items
 * named by their persistent reference), the Session interface below `sessions` (a fallback for
 * session paths that are not objects of ssb_add_session, so that a call to one is answered by the
 * close_session handler), and a node enumerator below `collections`.
 */
int ssb_bus_serve_objects(ssb_bus *bus, const char *collections, const char *aliases, const char *prompts, const char *references,
                          const char *sessions, const ssb_handlers *handlers);
/** Requests `name` without replacing its owner and without queueing: SSB_NAME_OWNED, SSB_NAME_TAKEN, or a negative errno. */
int ssb_request_name(ssb_bus *bus, const char *name);
/** Serves the Session interface at `path`; the object goes when *slot is released with ssb_slot_release. */
int ssb_add_session(ssb_bus *bus, const char *path, const ssb_handlers *handlers, ssb_slot **slot);
void ssb_slot_release(ssb_slot *slot);
/**
 * Processes messages until an error (a negative errno) or the bus closes (0). Whenever `wake_fd`
 * (an eventfd, or -1: none) is readable it is read (reset) and `woken(userdata)` runs on this
 * thread: how work done on other threads gets back to the bus. `woken` returns in how many
 * milliseconds it wants to run again with nothing to wake it (-1: not before a wake), and is called
 * once before the first wait.
 */
int ssb_bus_run(ssb_bus *bus, int wake_fd, int (*woken)(void *userdata), void *userdata);
/** A new wake descriptor for ssb_bus_run (an eventfd, close-on-exec, non-blocking), or a negative errno. */
int ssb_wake_fd_open(void);
/** Makes `wake_fd` readable (from any thread). */
void ssb_wake(int wake_fd);

/** The message's sender (a unique name), object path, interface and member, or NULL. */
const char *ssb_message_sender(ssb_message *m);
const char *ssb_message_path(ssb_message *m);
const char *ssb_message_interface(ssb_message *m);
const char *ssb_message_member(ssb_message *m);

/** sd_bus_path_encode(prefix, external) and sd_bus_path_decode: malloc'ed, NULL on failure (or a path not below prefix). */
char *ssb_path_encode(const char *prefix, const char *external);
char *ssb_path_decode(const char *path, const char *prefix);

/* Reading, each one fixed signature at the message's current position. Strings are valid while the message is. */
/** One basic string-like value: `type` 's' or 'o'. */
int ssb_read_string(ssb_message *m, char type, const char **value);
int ssb_read_bool(ssb_message *m, int *value);
/** An array of 's' or 'o' (`type`): *items a malloc'ed NULL-terminated array of malloc'ed strings (ssb_strv_free). */
int ssb_read_strings(ssb_message *m, char type, char ***items);
/** An a{ss}: *pairs a malloc'ed NULL-terminated array key, value, key, value … (ssb_strv_free). */
int ssb_read_string_dict(ssb_message *m, char ***pairs);
void ssb_strv_free(char **strv);
/** A Secret struct (oayays). */
int ssb_read_secret(ssb_message *m, const char **session, const void **parameters, size_t *parameters_size,
                    const void **value, size_t *value_size, const char **content_type);
/**
 * An a{sv} of properties, one entry at a time: ssb_enter_properties, then while ssb_next_property
 * gives 1 (*key its name, *contents the variant's signature) one of ssb_read_variant_string,
 * ssb_read_variant_string_dict, ssb_read_variant_bool or ssb_skip_variant, then ssb_end_property.
 * ssb_next_property gives 0 after the last entry (and leaves the array).
 */
int ssb_enter_properties(ssb_message *m);
int ssb_next_property(ssb_message *m, const char **key, const char **contents);
int ssb_read_variant_string(ssb_message *m, const char **value);
int ssb_read_variant_string_dict(ssb_message *m, char ***pairs);
int ssb_read_variant_bool(ssb_message *m, int *value);
int ssb_skip_variant(ssb_message *m);
int ssb_end_property(ssb_message *m);

/* Writing: a reply made with ssb_new_reply, values appended, then ssb_send (which releases it). */
int ssb_new_reply(ssb_message *call, ssb_message **reply);
/** Sends `reply` (made by ssb_new_reply) and releases it; releases it also on failure. */
int ssb_send(ssb_message *reply);
void ssb_release(ssb_message *reply);
int ssb_append_string(ssb_message *m, char type, const char *value);
int ssb_append_bool(ssb_message *m, int value);
int ssb_append_u64(ssb_message *m, uint64_t value);
/** An array of 's' or 'o' (`type`). */
int ssb_append_strings(ssb_message *m, char type, const char *const *items, size_t count);
/** An a{ss}. */
int ssb_append_string_dict(ssb_message *m, const char *const *keys, const char *const *values, size_t count);
/** A Secret struct (oayays). */
int ssb_append_secret(ssb_message *m, const char *session, const void *parameters, size_t parameters_size,
                      const void *value, size_t value_size, const char *content_type);
/** GetSecrets' a{o(oayays)}: ssb_open_secrets, an ssb_append_secrets_entry per item, ssb_close_container. */
int ssb_open_secrets(ssb_message *m);
int ssb_append_secrets_entry(ssb_message *m, const char *path, const char *session, const void *parameters,
                             size_t parameters_size, const void *value, size_t value_size, const char *content_type);
int ssb_close_container(ssb_message *m);

/** Sets `error` to the D-Bus error `name` with `text`; returns the negative errno sd-bus maps it to. */
int ssb_error_set(ssb_error *error, const char *name, const char *text);

/* Signals. Each is addressed to one bus connection, `destination` (a unique name), never to the
 * whole bus: what changed in an access group is told only to the senders that see it. */
/** `member`(o object) of `interface` from `path` (CollectionCreated, ItemChanged …). */
int ssb_emit_path_signal(ssb_bus *bus, const char *destination, const char *path, const char *interface,
                         const char *member, const char *object);
/**
 * org.freedesktop.DBus.Properties.PropertiesChanged for the NULL-terminated `names`: `Items` and
 * `Collections` as invalidated, any other (`Locked`, `Modified`, `Created`, `Label`) with its value,
 * which `handlers`' get_property appends for `path` with no call (the caller supplies whose view).
 */
int ssb_emit_properties_changed(ssb_bus *bus, const ssb_handlers *handlers, const char *destination, const char *path,
                                const char *interface, char **names);
/** Prompt.Completed(b dismissed, v result) with the result an `ao`. */
int ssb_emit_completed(ssb_bus *bus, const char *destination, const char *path, int dismissed, const char *const *paths,
                       size_t count);

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
