/* The Secret Service client calls of CSecretServiceClient.h through sd-bus; see the header. */
#include "CSecretServiceClient.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <systemd/sd-bus.h>

#define SERVICE_PATH "/org/freedesktop/secrets"
#define SERVICE_IFACE "org.freedesktop.Secret.Service"

static __thread char last_error[512];

const char *ssc_last_error(void) { return last_error; }

/* Records the failure (the D-Bus error if there is one, else `what` and errno) and returns r. */
static int fail(int r, const char *what, const sd_bus_error *e) {
    if (e && sd_bus_error_is_set(e))
        snprintf(last_error, sizeof last_error, "%s: %s", e->name, e->message ? e->message : "");
    else
        snprintf(last_error, sizeof last_error, "%s: %s", what, strerror(r < 0 ? -r : r));
    return r < 0 ? r : -EIO;
}

int ssc_open(ssc_bus **bus) {
    last_error[0] = 0;
    int r = sd_bus_open_user(bus);
    return r < 0 ? fail(r, "cannot connect to the session bus", NULL) : 0;
}

void ssc_close(ssc_bus *bus) { sd_bus_flush_close_unref(bus); }

void ssc_strv_free(char **strv) {
    if (!strv) return;
    for (char **p = strv; *p; p++) free(*p);
    free(strv);
}

int ssc_name_owner(ssc_bus *bus, const char *name, char **owner) {
    sd_bus_error e = SD_BUS_ERROR_NULL;
    sd_bus_message *reply = NULL;
    const char *s = NULL;
    last_error[0] = 0;
    int r = sd_bus_call_method(bus, "org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus", "GetNameOwner", &e, &reply, "s", name);
    if (r < 0) {
        r = sd_bus_error_has_name(&e, "org.freedesktop.DBus.Error.NameHasNoOwner") ? -ENXIO : r;
        r = fail(r, "GetNameOwner", &e);
        sd_bus_error_free(&e);
        return r;
    }
    r = sd_bus_message_read(reply, "s", &s);
    if (r >= 0) *owner = strdup(s);
    sd_bus_message_unref(reply);
    return r < 0 ? fail(r, "GetNameOwner's reply", NULL) : (*owner ? 0 : -ENOMEM);
}

int ssc_process_id(ssc_bus *bus, const char *name, uint32_t *pid) {
    sd_bus_error e = SD_BUS_ERROR_NULL;
    sd_bus_message *reply = NULL;
    last_error[0] = 0;
    int r = sd_bus_call_method(bus, "org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus", "GetConnectionUnixProcessID",
                               &e, &reply, "s", name);
    if (r < 0) { r = fail(r, "GetConnectionUnixProcessID", &e); sd_bus_error_free(&e); return r; }
    r = sd_bus_message_read(reply, "u", pid);
    sd_bus_message_unref(reply);
    return r < 0 ? fail(r, "GetConnectionUnixProcessID's reply", NULL) : 0;
}

int ssc_open_session(ssc_bus *bus, const char *dest, const char *algorithm, int input_bytes, const void *input, size_t size,
                     void **output, size_t *output_size, char **session) {
    sd_bus_error e = SD_BUS_ERROR_NULL;
    sd_bus_message *m = NULL, *reply = NULL;
    const char *contents = NULL, *path = NULL;
    char type = 0;
    last_error[0] = 0;
    *output = NULL; *output_size = 0; *session = NULL;
    int r = sd_bus_message_new_method_call(bus, &m, dest, SERVICE_PATH, SERVICE_IFACE, "OpenSession");
    if (r >= 0) r = sd_bus_message_append(m, "s", algorithm);
    if (r >= 0) r = sd_bus_message_open_container(m, 'v', input_bytes ? "ay" : "s");
    if (r >= 0) r = input_bytes ? sd_bus_message_append_array(m, 'y', input, size) : sd_bus_message_append(m, "s", "");
    if (r >= 0) r = sd_bus_message_close_container(m);
    if (r < 0) { sd_bus_message_unref(m); return fail(r, "OpenSession", NULL); }
    r = sd_bus_call(bus, m, 0, &e, &reply);
    sd_bus_message_unref(m);
    if (r < 0) { r = fail(r, "OpenSession", &e); sd_bus_error_free(&e); return r; }
    r = sd_bus_message_peek_type(reply, &type, &contents);
    if (r >= 0) r = sd_bus_message_enter_container(reply, 'v', contents);
    if (r >= 0 && strcmp(contents, "ay") == 0) {
        const void *p = NULL;
        size_t n = 0;
        r = sd_bus_message_read_array(reply, 'y', &p, &n);
        if (r >= 0 && n > 0) {
            *output = malloc(n);
            if (!*output) r = -ENOMEM; else { memcpy(*output, p, n); *output_size = n; }
        }
    } else if (r >= 0) {
        r = sd_bus_message_skip(reply, contents);
    }
    if (r >= 0) r = sd_bus_message_exit_container(reply);
    if (r >= 0) r = sd_bus_message_read(reply, "o", &path);
    if (r >= 0 && !(*session = strdup(path))) r = -ENOMEM;
    sd_bus_message_unref(reply);
    if (r < 0) { free(*output); *output = NULL; *output_size = 0; return fail(r, "OpenSession's reply", NULL); }
    return 0;
}

int ssc_close_session(ssc_bus *bus, const char *dest, const char *session) {
    sd_bus_error e = SD_BUS_ERROR_NULL;
    last_error[0] = 0;
    int r = sd_bus_call_method(bus, dest, session, "org.freedesktop.Secret.Session", "Close", &e, NULL, "");
    if (r < 0) { r = fail(r, "Session.Close", &e); sd_bus_error_free(&e); return r; }
    return 0;
}

int ssc_get_paths(ssc_bus *bus, const char *dest, const char *path, const char *interface, const char *property, char ***paths) {
    sd_bus_error e = SD_BUS_ERROR_NULL;
    sd_bus_message *reply = NULL;
    last_error[0] = 0;
    *paths = NULL;
    int r = sd_bus_get_property(bus, dest, path, interface, property, &e, &reply, "ao");
    if (r < 0) { r = fail(r, property, &e); sd_bus_error_free(&e); return r; }
    r = sd_bus_message_read_strv(reply, paths);
    sd_bus_message_unref(reply);
    if (r >= 0 && !*paths && !(*paths = calloc(1, sizeof(char *)))) r = -ENOMEM;
    return r < 0 ? fail(r, property, NULL) : 0;
}

int ssc_get_string(ssc_bus *bus, const char *dest, const char *path, const char *interface, const char *property, char **value) {
    sd_bus_error e = SD_BUS_ERROR_NULL;
    last_error[0] = 0;
    int r = sd_bus_get_property_string(bus, dest, path, interface, property, &e, value);
    if (r < 0) { r = fail(r, property, &e); sd_bus_error_free(&e); return r; }
    return 0;
}

int ssc_get_bool(ssc_bus *bus, const char *dest, const char *path, const char *interface, const char *property, int *value) {
    sd_bus_error e = SD_BUS_ERROR_NULL;
    last_error[0] = 0;
    int r = sd_bus_get_property_trivial(bus, dest, path, interface, property, &e, 'b', value);
    if (r < 0) { r = fail(r, property, &e); sd_bus_error_free(&e); return r; }
    return 0;
}

int ssc_get_attributes(ssc_bus *bus, const char *dest, const char *item, char ***pairs) {
    sd_bus_error e = SD_BUS_ERROR_NULL;
    sd_bus_message *reply = NULL;
    size_t n = 0, cap = 0;
    char **out = NULL;
    last_error[0] = 0;
    *pairs = NULL;
    int r = sd_bus_get_property(bus, dest, item, "org.freedesktop.Secret.Item", "Attributes", &e, &reply, "a{ss}");
    if (r < 0) { r = fail(r, "Attributes", &e); sd_bus_error_free(&e); return r; }
    r = sd_bus_message_enter_container(reply, 'a', "{ss}");
    while (r >= 0 && (r = sd_bus_message_enter_container(reply, 'e', "ss")) > 0) {
        const char *k = NULL, *v = NULL;
        r = sd_bus_message_read(reply, "ss", &k, &v);
        if (r >= 0) r = sd_bus_message_exit_container(reply);
        if (r < 0) break;
        if (n + 3 > cap) {
            size_t c = cap ? cap * 2 : 16;
            char **grown = realloc(out, c * sizeof(char *));
            if (!grown) { r = -ENOMEM; break; }
            out = grown; cap = c;
        }
        out[n] = strdup(k); out[n + 1] = strdup(v); out[n + 2] = NULL;
        if (!out[n] || !out[n + 1]) { free(out[n]); free(out[n + 1]); out[n] = NULL; r = -ENOMEM; break; }
        n += 2;
    }
    if (r >= 0) r = sd_bus_message_exit_container(reply);
    sd_bus_message_unref(reply);
    if (r >= 0 && !out && !(out = calloc(1, sizeof(char *)))) r = -ENOMEM;
    if (r < 0) { ssc_strv_free(out); return fail(r, "Attributes", NULL); }
    *pairs = out;
    return 0;
}

int ssc_path_name(const char *path, const char *prefix, char **name) {
    last_error[0] = 0;
    int r = sd_bus_path_decode(path, prefix, name);
    if (r < 0) return fail(r, "sd_bus_path_decode", NULL);
    if (r == 0) { snprintf(last_error, sizeof last_error, "%s is not below %s", path, prefix); return -EINVAL; }
    return 0;
}

/* Appends `objects` as "ao". */
static int append_paths(sd_bus_message *m, const char *const *objects, size_t count) {
    int r = sd_bus_message_open_container(m, 'a', "o");
    for (size_t i = 0; r >= 0 && i < count; i++) r = sd_bus_message_append_basic(m, 'o', objects[i]);
    return r < 0 ? r : sd_bus_message_close_container(m);
}

int ssc_unlock(ssc_bus *bus, const char *dest, const char *const *objects, size_t count, char ***unlocked, char **prompt) {
    sd_bus_error e = SD_BUS_ERROR_NULL;
    sd_bus_message *m = NULL, *reply = NULL;
    const char *p = NULL;
    last_error[0] = 0;
    *unlocked = NULL; *prompt = NULL;
    int r = sd_bus_message_new_method_call(bus, &m, dest, SERVICE_PATH, SERVICE_IFACE, "Unlock");
    if (r >= 0) r = append_paths(m, objects, count);
    if (r < 0) { sd_bus_message_unref(m); return fail(r, "Unlock", NULL); }
    r = sd_bus_call(bus, m, 0, &e, &reply);
    sd_bus_message_unref(m);
    if (r < 0) { r = fail(r, "Unlock", &e); sd_bus_error_free(&e); return r; }
    r = sd_bus_message_read_strv(reply, unlocked);
    if (r >= 0) r = sd_bus_message_read(reply, "o", &p);
    if (r >= 0 && !(*prompt = strdup(p))) r = -ENOMEM;
    if (r >= 0 && !*unlocked && !(*unlocked = calloc(1, sizeof(char *)))) r = -ENOMEM;
    sd_bus_message_unref(reply);
    if (r < 0) { ssc_strv_free(*unlocked); *unlocked = NULL; free(*prompt); *prompt = NULL; return fail(r, "Unlock's reply", NULL); }
    return 0;
}

struct prompt_wait {
    const char *dest;
    int done, dismissed, gone, error;
    char **result;
};

static int on_completed(sd_bus_message *m, void *userdata, sd_bus_error *e) {
    (void)e;
    struct prompt_wait *w = userdata;
    const char *contents = NULL;
    char type = 0;
    int dismissed = 0;
    int r = sd_bus_message_read(m, "b", &dismissed);
    if (r >= 0) r = sd_bus_message_peek_type(m, &type, &contents);
    if (r >= 0 && contents && strcmp(contents, "ao") == 0) {
        r = sd_bus_message_enter_container(m, 'v', "ao");
        if (r >= 0) r = sd_bus_message_read_strv(m, &w->result);
    }
    w->done = 1;
    w->dismissed = dismissed;
    if (r < 0) w->error = r;
    return 0;
}

static int on_owner_changed(sd_bus_message *m, void *userdata, sd_bus_error *e) {
    (void)e;
    struct prompt_wait *w = userdata;
    const char *name = NULL, *old_owner = NULL, *new_owner = NULL;
    if (sd_bus_message_read(m, "sss", &name, &old_owner, &new_owner) >= 0 && strcmp(name, w->dest) == 0 && new_owner[0] == 0) w->gone = 1;
    return 0;
}

static uint64_t now_usec(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

int ssc_prompt(ssc_bus *bus, const char *dest, const char *prompt, uint64_t timeout_usec, int *dismissed, char ***result) {
    sd_bus_error e = SD_BUS_ERROR_NULL;
    sd_bus_slot *completed = NULL, *owner = NULL;
    struct prompt_wait w = { .dest = dest };
    last_error[0] = 0;
    *dismissed = 1; *result = NULL;
    /* Subscribed before Prompt is called, so a Completed that follows at once is not missed. */
    int r = sd_bus_match_signal(bus, &completed, dest, prompt, "org.freedesktop.Secret.Prompt", "Completed", on_completed, &w);
    if (r >= 0) r = sd_bus_match_signal(bus, &owner, "org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus",
                                        "NameOwnerChanged", on_owner_changed, &w);
    if (r < 0) { r = fail(r, "subscribing to Prompt.Completed", NULL); goto out; }
    r = sd_bus_call_method(bus, dest, prompt, "org.freedesktop.Secret.Prompt", "Prompt", &e, NULL, "s", "");
    if (r < 0) { r = fail(r, "Prompt", &e); goto out; }
    uint64_t deadline = now_usec() + timeout_usec;
    while (!w.done && !w.gone) {
        r = sd_bus_process(bus, NULL);
        if (r < 0) { r = fail(r, "waiting for Prompt.Completed", NULL); goto out; }
        if (r > 0) continue;
        uint64_t now = now_usec();
        if (now >= deadline) { snprintf(last_error, sizeof last_error, "the prompt did not complete in time"); r = -ETIMEDOUT; goto out; }
        r = sd_bus_wait(bus, deadline - now);
        if (r < 0) { r = fail(r, "waiting for Prompt.Completed", NULL); goto out; }
    }
    if (!w.done) { snprintf(last_error, sizeof last_error, "the provider left the bus during the prompt"); r = -ECONNRESET; goto out; }
    if (w.error < 0) { r = fail(w.error, "Prompt.Completed", NULL); goto out; }
    *dismissed = w.dismissed;
    *result = w.result ? w.result : calloc(1, sizeof(char *));
    w.result = NULL;
    r = *result ? 0 : -ENOMEM;
out:
    ssc_strv_free(w.result);
    sd_bus_error_free(&e);
    sd_bus_slot_unref(completed);
    sd_bus_slot_unref(owner);
    return r;
}

int ssc_get_secrets(ssc_bus *bus, const char *dest, const char *const *items, size_t count, const char *session,
                    ssc_secret_sink sink, void *context) {
    sd_bus_error e = SD_BUS_ERROR_NULL;
    sd_bus_message *m = NULL, *reply = NULL;
    int n = 0;
    last_error[0] = 0;
    int r = sd_bus_message_new_method_call(bus, &m, dest, SERVICE_PATH, SERVICE_IFACE, "GetSecrets");
    if (r >= 0) r = append_paths(m, items, count);
    if (r >= 0) r = sd_bus_message_append_basic(m, 'o', session);
    if (r < 0) { sd_bus_message_unref(m); return fail(r, "GetSecrets", NULL); }
    r = sd_bus_call(bus, m, 0, &e, &reply);
    sd_bus_message_unref(m);
    if (r < 0) { r = fail(r, "GetSecrets", &e); sd_bus_error_free(&e); return r; }
    /* The reply holds the secrets (encrypted for a DH session, plain otherwise): wiped when freed. */
    sd_bus_message_sensitive(reply);
    r = sd_bus_message_enter_container(reply, 'a', "{o(oayays)}");
    while (r >= 0 && (r = sd_bus_message_enter_container(reply, 'e', "o(oayays)")) > 0) {
        const char *item = NULL, *s = NULL, *content_type = NULL;
        const void *parameters = NULL, *value = NULL;
        size_t parameters_size = 0, value_size = 0;
        r = sd_bus_message_read(reply, "o", &item);
        if (r >= 0) r = sd_bus_message_enter_container(reply, 'r', "oayays");
        if (r >= 0) r = sd_bus_message_read(reply, "o", &s);
        if (r >= 0) r = sd_bus_message_read_array(reply, 'y', &parameters, &parameters_size);
        if (r >= 0) r = sd_bus_message_read_array(reply, 'y', &value, &value_size);
        if (r >= 0) r = sd_bus_message_read(reply, "s", &content_type);
        if (r >= 0) r = sd_bus_message_exit_container(reply);
        if (r >= 0) r = sd_bus_message_exit_container(reply);
        if (r < 0) break;
        sink(context, item, parameters, parameters_size, value, value_size, content_type);
        n++;
    }
    if (r >= 0) r = sd_bus_message_exit_container(reply);
    sd_bus_message_unref(reply);
    return r < 0 ? fail(r, "GetSecrets' reply", NULL) : n;
}
