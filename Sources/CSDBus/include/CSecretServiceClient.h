/*
 * CSecretServiceClient (in the CSDBus target): the thin C wall between CofferSecretServiceImport and
 * sd-bus (libsystemd) for reading another Secret Service provider as a client (`coffer import
 * secret-service`, issue #26). sd-bus's readers and writers take C varargs, which Swift cannot
 * call: each function here makes one call of one fixed signature. All marshalling is sd-bus's;
 * nothing here parses D-Bus bytes. Only CofferSecretServiceImport calls it (CSDBus.h has the
 * wall's rule). Every function returns 0 (or a count) on success and a negative errno on
 * failure, with the D-Bus error's name and message in ssc_last_error() (this thread's, until the
 * next call). Replies that carry secrets are marked sensitive (sd_bus_message_sensitive): sd-bus
 * wipes them when they are freed.
 */
#ifndef CSECRETSERVICECLIENT_H
#define CSECRETSERVICECLIENT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sd_bus ssc_bus;

/** The last failure's D-Bus error (name: message), or an empty string. */
const char *ssc_last_error(void);

/** Connects to the session bus (DBUS_SESSION_BUS_ADDRESS, else the user's default). */
int ssc_open(ssc_bus **bus);
void ssc_close(ssc_bus *bus);

/** The unique name owning `name` (free() it), or -ENXIO (ssc_last_error says NameHasNoOwner) when nobody does. */
int ssc_name_owner(ssc_bus *bus, const char *name, char **owner);
/** GetConnectionUnixProcessID of `name`. */
int ssc_process_id(ssc_bus *bus, const char *name, uint32_t *pid);

/** A NULL-terminated array of strings, each and the array freed by ssc_strv_free. */
void ssc_strv_free(char **strv);

/**
 * Service.OpenSession(algorithm, input) at /org/freedesktop/secrets of `dest`: the input variant is
 * "ay" (`input`, `size`) when `input_bytes` is non-zero, else the empty string "s". *output (free()
 * it; NULL and 0 when the output is a string) and *session (free() it).
 */
int ssc_open_session(ssc_bus *bus, const char *dest, const char *algorithm, int input_bytes, const void *input, size_t size,
                     void **output, size_t *output_size, char **session);
/** Session.Close on `session`. */
int ssc_close_session(ssc_bus *bus, const char *dest, const char *session);

/** A property of type "ao" (Service.Collections, Collection.Items) as an array of paths. */
int ssc_get_paths(ssc_bus *bus, const char *dest, const char *path, const char *interface, const char *property, char ***paths);
/** A property of type "s" (Label); free() it. */
int ssc_get_string(ssc_bus *bus, const char *dest, const char *path, const char *interface, const char *property, char **value);
/** A property of type "b" (Locked). */
int ssc_get_bool(ssc_bus *bus, const char *dest, const char *path, const char *interface, const char *property, int *value);
/** Item.Attributes (a{ss}) as NAME, VALUE, NAME, VALUE … in one array. */
int ssc_get_attributes(ssc_bus *bus, const char *dest, const char *item, char ***pairs);

/** The last component of `path` below `prefix`, unescaped as sd_bus_path_decode does (free() it). */
int ssc_path_name(const char *path, const char *prefix, char **name);

/** Service.Unlock(objects): *unlocked the objects unlocked at once, *prompt the prompt path ("/" when none; free() it). */
int ssc_unlock(ssc_bus *bus, const char *dest, const char *const *objects, size_t count, char ***unlocked, char **prompt);
/**
 * Prompt.Prompt("") on `prompt`, then waits up to `timeout_usec` for its Completed signal: *dismissed
 * and, when the result is "ao", *result (else an empty array). -ETIMEDOUT when nothing came; -ECONNRESET
 * when `dest` left the bus meanwhile.
 */
int ssc_prompt(ssc_bus *bus, const char *dest, const char *prompt, uint64_t timeout_usec, int *dismissed, char ***result);

/** Receives one secret of ssc_get_secrets (the bytes are valid only during the call). */
typedef void (*ssc_secret_sink)(void *context, const char *item, const void *parameters, size_t parameters_size,
                                const void *value, size_t value_size, const char *content_type);
/** Service.GetSecrets(items, session): `sink` once per secret returned (locked items are left out); the count. */
int ssc_get_secrets(ssc_bus *bus, const char *dest, const char *const *items, size_t count, const char *session,
                    ssc_secret_sink sink, void *context);

#ifdef __cplusplus
}
#endif

#endif
