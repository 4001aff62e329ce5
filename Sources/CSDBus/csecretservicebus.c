/* The sd-bus wall of the Secret Service front end: see include/CSecretServiceBus.h. */
#include "CSecretServiceBus.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <systemd/sd-bus.h>
#include <time.h>
#include <unistd.h>

#define SERVICE_IFACE "org.freedesktop.Secret.Service"
#define SESSION_IFACE "org.freedesktop.Secret.Session"
#define COLLECTION_IFACE "org.freedesktop.Secret.Collection"
#define ITEM_IFACE "org.freedesktop.Secret.Item"
#define PROMPT_IFACE "org.freedesktop.Secret.Prompt"
#define COFFER_ITEM_IFACE "io.coffer.Item"

/* The handlers pointer travels as each vtable's and match's userdata. */
static int open_session_cb(sd_bus_message *m, void *userdata, sd_bus_error *error) {
    (void)error;
    const ssb_handlers *h = userdata;
    return h->open_session(m, h->userdata);
}

static int close_session_cb(sd_bus_message *m, void *userdata, sd_bus_error *error) {
    (void)error;
    const ssb_handlers *h = userdata;
    return h->close_session(m, h->userdata);
}

static int method_cb(sd_bus_message *m, void *userdata, sd_bus_error *error) {
    (void)error;
    const ssb_handlers *h = userdata;
    return h->method(m, h->userdata);
}

static int get_property_cb(sd_bus *bus, const char *path, const char *interface, const char *property,
                           sd_bus_message *reply, void *userdata, sd_bus_error *error) {
    const ssb_handlers *h = userdata;
    return h->get_property(sd_bus_get_current_message(bus), path, interface, property, reply, (ssb_error *)error, h->userdata);
}

static int set_property_cb(sd_bus *bus, const char *path, const char *interface, const char *property,
                           sd_bus_message *value, void *userdata, sd_bus_error *error) {
    const ssb_handlers *h = userdata;
    return h->set_property(sd_bus_get_current_message(bus), path, interface, property, value, (ssb_error *)error, h->userdata);
}

static int find_cb(sd_bus *bus, const char *path, const char *interface, void *userdata, void **found, sd_bus_error *error) {
    (void)error;
    const ssb_handlers *h = userdata;
    sd_bus_message *m = sd_bus_get_current_message(bus);
    int introspecting = m && sd_bus_message_is_method_call(m, "org.freedesktop.DBus.Introspectable", "Introspect") > 0;
    if (h->find(path, interface, introspecting, h->userdata) <= 0) return 0;
    *found = userdata;
    return 1;
}

static int enumerate_cb(sd_bus *bus, const char *prefix, void *userdata, char ***nodes, sd_bus_error *error) {
    (void)error;
    const ssb_handlers *h = userdata;
    *nodes = h->enumerate(sd_bus_get_current_message(bus), prefix, h->userdata);
    return 0;
}

static int name_owner_changed_cb(sd_bus_message *m, void *userdata, sd_bus_error *error) {
    (void)error;
    const ssb_handlers *h = userdata;
    const char *name = NULL, *old_owner = NULL, *new_owner = NULL;
    if (sd_bus_message_read(m, "sss", &name, &old_owner, &new_owner) < 0) return 0;
    h->name_owner_changed(name, old_owner, new_owner, h->userdata);
    return 0;
}

static const sd_bus_vtable service_vtable[] = {
    SD_BUS_VTABLE_START(0),
    SD_BUS_METHOD_WITH_NAMES("OpenSession", "sv", SD_BUS_PARAM(algorithm) SD_BUS_PARAM(input),
                             "vo", SD_BUS_PARAM(output) SD_BUS_PARAM(result), open_session_cb, 0),
    SD_BUS_METHOD_WITH_NAMES("CreateCollection", "a{sv}s", SD_BUS_PARAM(properties) SD_BUS_PARAM(alias),
                             "oo", SD_BUS_PARAM(collection) SD_BUS_PARAM(prompt), method_cb, 0),
    SD_BUS_METHOD_WITH_NAMES("SearchItems", "a{ss}", SD_BUS_PARAM(attributes),
                             "aoao", SD_BUS_PARAM(unlocked) SD_BUS_PARAM(locked), method_cb, 0),
    SD_BUS_METHOD_WITH_NAMES("Unlock", "ao", SD_BUS_PARAM(objects), "aoo", SD_BUS_PARAM(unlocked) SD_BUS_PARAM(prompt), method_cb, 0),
    SD_BUS_METHOD_WITH_NAMES("Lock", "ao", SD_BUS_PARAM(objects), "aoo", SD_BUS_PARAM(locked) SD_BUS_PARAM(prompt), method_cb, 0),
    SD_BUS_METHOD_WITH_NAMES("GetSecrets", "aoo", SD_BUS_PARAM(items) SD_BUS_PARAM(session),
                             "a{o(oayays)}", SD_BUS_PARAM(secrets), method_cb, 0),
    SD_BUS_METHOD_WITH_NAMES("ReadAlias", "s", SD_BUS_PARAM(name), "o", SD_BUS_PARAM(collection), method_cb, 0),
    SD_BUS_METHOD_WITH_NAMES("SetAlias", "so", SD_BUS_PARAM(name) SD_BUS_PARAM(collection), "", "", method_cb, 0),
    /* Lists that grow with the keychain are announced as invalidated, not sent: sending Items with every
     * CreateItem listed the whole collection through the agent (a store at 10,000 items cost 0.5 s). */
    SD_BUS_PROPERTY("Collections", "ao", get_property_cb, 0, SD_BUS_VTABLE_PROPERTY_EMITS_INVALIDATION),
    SD_BUS_SIGNAL_WITH_NAMES("CollectionCreated", "o", SD_BUS_PARAM(collection), 0),
    SD_BUS_SIGNAL_WITH_NAMES("CollectionDeleted", "o", SD_BUS_PARAM(collection), 0),
    SD_BUS_SIGNAL_WITH_NAMES("CollectionChanged", "o", SD_BUS_PARAM(collection), 0),
    SD_BUS_VTABLE_END,
};

static const sd_bus_vtable collection_vtable[] = {
    SD_BUS_VTABLE_START(0),
    SD_BUS_METHOD_WITH_NAMES("Delete", "", "", "o", SD_BUS_PARAM(prompt), method_cb, 0),
    SD_BUS_METHOD_WITH_NAMES("SearchItems", "a{ss}", SD_BUS_PARAM(attributes), "ao", SD_BUS_PARAM(results), method_cb, 0),
    SD_BUS_METHOD_WITH_NAMES("CreateItem", "a{sv}(oayays)b", SD_BUS_PARAM(properties) SD_BUS_PARAM(secret) SD_BUS_PARAM(replace),
                             "oo", SD_BUS_PARAM(item) SD_BUS_PARAM(prompt), method_cb, 0),
    SD_BUS_PROPERTY("Items", "ao", get_property_cb, 0, SD_BUS_VTABLE_PROPERTY_EMITS_INVALIDATION),
    SD_BUS_WRITABLE_PROPERTY("Label", "s", get_property_cb, set_property_cb, 0, SD_BUS_VTABLE_PROPERTY_EMITS_CHANGE),
    SD_BUS_PROPERTY("Locked", "b", get_property_cb, 0, SD_BUS_VTABLE_PROPERTY_EMITS_CHANGE),
    SD_BUS_PROPERTY("Created", "t", get_property_cb, 0, SD_BUS_VTABLE_PROPERTY_EMITS_CHANGE),
    SD_BUS_PROPERTY("Modified", "t", get_property_cb, 0, SD_BUS_VTABLE_PROPERTY_EMITS_CHANGE),
    SD_BUS_SIGNAL_WITH_NAMES("ItemCreated", "o", SD_BUS_PARAM(item), 0),
    SD_BUS_SIGNAL_WITH_NAMES("ItemDeleted", "o", SD_BUS_PARAM(item), 0),
    SD_BUS_SIGNAL_WITH_NAMES("ItemChanged", "o", SD_BUS_PARAM(item), 0),
    SD_BUS_VTABLE_END,
};

static const sd_bus_vtable item_vtable[] = {
    SD_BUS_VTABLE_START(0),
    SD_BUS_METHOD_WITH_NAMES("Delete", "", "", "o", SD_BUS_PARAM(prompt), method_cb, 0),
    SD_BUS_METHOD_WITH_NAMES("GetSecret", "o", SD_BUS_PARAM(session), "(oayays)", SD_BUS_PARAM(secret), method_cb, 0),
    SD_BUS_METHOD_WITH_NAMES("SetSecret", "(oayays)", SD_BUS_PARAM(secret), "", "", method_cb, 0),
    SD_BUS_PROPERTY("Locked", "b", get_property_cb, 0, SD_BUS_VTABLE_PROPERTY_EMITS_CHANGE),
    SD_BUS_WRITABLE_PROPERTY("Attributes", "a{ss}", get_property_cb, set_property_cb, 0, SD_BUS_VTABLE_PROPERTY_EMITS_CHANGE),
    SD_BUS_WRITABLE_PROPERTY("Label", "s", get_property_cb, set_property_cb, 0, SD_BUS_VTABLE_PROPERTY_EMITS_CHANGE),
    SD_BUS_PROPERTY("Type", "s", get_property_cb, 0, SD_BUS_VTABLE_PROPERTY_EMITS_CHANGE),
    SD_BUS_PROPERTY("Created", "t", get_property_cb, 0, SD_BUS_VTABLE_PROPERTY_EMITS_CHANGE),
    SD_BUS_PROPERTY("Modified", "t", get_property_cb, 0, SD_BUS_VTABLE_PROPERTY_EMITS_CHANGE),
    SD_BUS_VTABLE_END,
};

/* Coffer's own read-only item properties (SecretServiceMapping.md, Which class a new item gets). */
static const sd_bus_vtable coffer_item_vtable[] = {
    SD_BUS_VTABLE_START(0),
    SD_BUS_PROPERTY("AccessControl", "s", get_property_cb, 0, SD_BUS_VTABLE_PROPERTY_EMITS_CHANGE),
    SD_BUS_VTABLE_END,
};

static const sd_bus_vtable prompt_vtable[] = {
    SD_BUS_VTABLE_START(0),
    SD_BUS_METHOD_WITH_NAMES("Prompt", "s", SD_BUS_PARAM(window_id), "", "", method_cb, 0),
    SD_BUS_METHOD("Dismiss", "", "", method_cb, 0),
    SD_BUS_SIGNAL_WITH_NAMES("Completed", "bv", SD_BUS_PARAM(dismissed) SD_BUS_PARAM(result), 0),
    SD_BUS_VTABLE_END,
};

static const sd_bus_vtable session_vtable[] = {
    SD_BUS_VTABLE_START(0),
    SD_BUS_METHOD("Close", "", "", close_session_cb, 0),
    SD_BUS_VTABLE_END,
};

int ssb_bus_open_session(ssb_bus **bus) {
    /* sd_bus_open_user takes DBUS_SESSION_BUS_ADDRESS when set, else $XDG_RUNTIME_DIR/bus. */
    return sd_bus_open_user(bus);
}

void ssb_bus_close(ssb_bus *bus) { sd_bus_flush_close_unref(bus); }

int ssb_bus_serve_service(ssb_bus *bus, const char *path, const ssb_handlers *handlers) {
    int r = sd_bus_add_object_vtable(bus, NULL, path, SERVICE_IFACE, service_vtable, (void *)handlers);
    if (r < 0) return r;
    return sd_bus_match_signal(bus, NULL, "org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus",
                               "NameOwnerChanged", name_owner_changed_cb, (void *)handlers);
}

int ssb_bus_serve_objects(ssb_bus *bus, const char *collections, const char *aliases, const char *prompts, const char *references,
                          const char *sessions, const ssb_handlers *handlers) {
    void *u = (void *)handlers;
    int r = sd_bus_add_fallback_vtable(bus, NULL, collections, COLLECTION_IFACE, collection_vtable, find_cb, u);
    if (r >= 0) r = sd_bus_add_fallback_vtable(bus, NULL, collections, ITEM_IFACE, item_vtable, find_cb, u);
    if (r >= 0) r = sd_bus_add_fallback_vtable(bus, NULL, collections, COFFER_ITEM_IFACE, coffer_item_vtable, find_cb, u);
    if (r >= 0) r = sd_bus_add_fallback_vtable(bus, NULL, aliases, COLLECTION_IFACE, collection_vtable, find_cb, u);
    /* No item lives under an alias; the Item interfaces are there so that a call to one is answered NoSuchObject. */
    if (r >= 0) r = sd_bus_add_fallback_vtable(bus, NULL, aliases, ITEM_IFACE, item_vtable, find_cb, u);
    if (r >= 0) r = sd_bus_add_fallback_vtable(bus, NULL, aliases, COFFER_ITEM_IFACE, coffer_item_vtable, find_cb, u);
    if (r >= 0) r = sd_bus_add_fallback_vtable(bus, NULL, prompts, PROMPT_IFACE, prompt_vtable, find_cb, u);
    if (r >= 0) r = sd_bus_add_fallback_vtable(bus, NULL, references, ITEM_IFACE, item_vtable, find_cb, u);
    if (r >= 0) r = sd_bus_add_fallback_vtable(bus, NULL, references, COFFER_ITEM_IFACE, coffer_item_vtable, find_cb, u);
    /* Sessions are objects of their own (ssb_add_session); this fallback takes calls to session paths
     * that are not (never opened, or closed), so that they are answered NoSuchObject. */
    if (r >= 0) r = sd_bus_add_fallback_vtable(bus, NULL, sessions, SESSION_IFACE, session_vtable, find_cb, u);
    /* Every other path (outside the service's namespace, or one of its bare nodes): a call to one of
     * the Secret Service's object interfaces there is answered NoSuchObject too, never sd-bus's
     * UnknownObject, which clients such as python-secretstorage 3.3 do not read as "no such item".
     * The more specific fallbacks above are tried first. */
    if (r >= 0) r = sd_bus_add_fallback_vtable(bus, NULL, "/", COLLECTION_IFACE, collection_vtable, find_cb, u);
    if (r >= 0) r = sd_bus_add_fallback_vtable(bus, NULL, "/", ITEM_IFACE, item_vtable, find_cb, u);
    if (r >= 0) r = sd_bus_add_fallback_vtable(bus, NULL, "/", PROMPT_IFACE, prompt_vtable, find_cb, u);
    if (r >= 0) r = sd_bus_add_fallback_vtable(bus, NULL, "/", SESSION_IFACE, session_vtable, find_cb, u);
    if (r >= 0) r = sd_bus_add_node_enumerator(bus, NULL, collections, enumerate_cb, u);
    return r;
}

int ssb_request_name(ssb_bus *bus, const char *name) {
    /* Flags 0: no SD_BUS_NAME_REPLACE_EXISTING, no SD_BUS_NAME_QUEUE. Another owner gives -EEXIST. */
    int r = sd_bus_request_name(bus, name, 0);
    if (r == -EEXIST) return SSB_NAME_TAKEN;
    if (r < 0 && r != -EALREADY) return r;
    return SSB_NAME_OWNED;
}

int ssb_add_session(ssb_bus *bus, const char *path, const ssb_handlers *handlers, ssb_slot **slot) {
    return sd_bus_add_object_vtable(bus, slot, path, SESSION_IFACE, session_vtable, (void *)handlers);
}

void ssb_slot_release(ssb_slot *slot) { sd_bus_slot_unref(slot); }

int ssb_bus_run(ssb_bus *bus, int wake_fd, int (*woken)(void *userdata), void *userdata) {
    int again = woken ? woken(userdata) : -1;
    for (;;) {
        int r = sd_bus_process(bus, NULL);
        if (r == -ECONNRESET || r == -ENOTCONN) return 0;
        if (r < 0) return r;
        if (r > 0) continue;
        if (wake_fd < 0) {
            r = sd_bus_wait(bus, UINT64_MAX);
            if (r < 0 && r != -EINTR) return r;
            continue;
        }
        /* sd_bus_wait's poll, with the wake descriptor beside the bus's. */
        int events = sd_bus_get_events(bus);
        if (events < 0) return events == -ENOTCONN ? 0 : events;
        uint64_t until = UINT64_MAX;
        r = sd_bus_get_timeout(bus, &until);
        if (r < 0) return r;
        int timeout = -1;
        if (until != UINT64_MAX) {
            struct timespec now;
            clock_gettime(CLOCK_MONOTONIC, &now);
            uint64_t n = (uint64_t)now.tv_sec * 1000000u + (uint64_t)now.tv_nsec / 1000u;
            timeout = until <= n ? 0 : (until - n) / 1000u + 1 > INT_MAX ? INT_MAX : (int)((until - n) / 1000u + 1);
        }
        if (again >= 0 && (timeout < 0 || again < timeout)) timeout = again;
        struct pollfd p[2] = {{.fd = sd_bus_get_fd(bus), .events = (short)events}, {.fd = wake_fd, .events = POLLIN}};
        r = poll(p, 2, timeout);
        if (r < 0 && errno != EINTR) return -errno;
        int wake = r > 0 && (p[1].revents & POLLIN);
        if (wake) {
            uint64_t count;
            if (read(wake_fd, &count, sizeof count) < 0 && errno != EAGAIN && errno != EINTR) return -errno;
        }
        /* Woken, or a wait ended by a timeout (the bus's or the caller's own). */
        if (woken && (wake || r == 0)) again = woken(userdata);
    }
}

int ssb_wake_fd_open(void) {
    int fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    return fd < 0 ? -errno : fd;
}

void ssb_wake(int wake_fd) {
    uint64_t one = 1;
    while (write(wake_fd, &one, sizeof one) < 0 && errno == EINTR) {}
}

const char *ssb_message_sender(ssb_message *m) { return sd_bus_message_get_sender(m); }
const char *ssb_message_path(ssb_message *m) { return sd_bus_message_get_path(m); }
const char *ssb_message_interface(ssb_message *m) { return sd_bus_message_get_interface(m); }
const char *ssb_message_member(ssb_message *m) { return sd_bus_message_get_member(m); }

char *ssb_path_encode(const char *prefix, const char *external) {
    char *out = NULL;
    return sd_bus_path_encode(prefix, external, &out) < 0 ? NULL : out;
}

char *ssb_path_decode(const char *path, const char *prefix) {
    char *out = NULL;
    return sd_bus_path_decode(path, prefix, &out) <= 0 ? NULL : out;
}

int ssb_read_string(ssb_message *m, char type, const char **value) { return sd_bus_message_read_basic(m, type, value); }

int ssb_read_bool(ssb_message *m, int *value) { return sd_bus_message_read_basic(m, 'b', value); }

int ssb_read_strings(ssb_message *m, char type, char ***items) {
    *items = NULL;
    char sig[2] = {type, 0};
    int r = sd_bus_message_enter_container(m, 'a', sig);
    if (r < 0) return r;
    size_t n = 0, cap = 8;
    char **out = calloc(cap + 1, sizeof(char *));
    if (!out) return -ENOMEM;
    const char *s = NULL;
    while ((r = sd_bus_message_read_basic(m, type, &s)) > 0) {
        if (n == cap) {
            char **grown = realloc(out, (2 * cap + 1) * sizeof(char *));
            if (!grown) { r = -ENOMEM; break; }
            out = grown;
            cap *= 2;
        }
        if (!(out[n] = strdup(s))) { r = -ENOMEM; break; }
        out[++n] = NULL;
    }
    if (r >= 0) r = sd_bus_message_exit_container(m);
    if (r < 0) { ssb_strv_free(out); return r; }
    *items = out;
    return 0;
}

int ssb_read_string_dict(ssb_message *m, char ***pairs) {
    *pairs = NULL;
    int r = sd_bus_message_enter_container(m, 'a', "{ss}");
    if (r < 0) return r;
    size_t n = 0, cap = 8;
    char **out = calloc(cap + 1, sizeof(char *));
    if (!out) return -ENOMEM;
    const char *k = NULL, *v = NULL;
    while ((r = sd_bus_message_enter_container(m, 'e', "ss")) > 0) {
        if ((r = sd_bus_message_read_basic(m, 's', &k)) < 0) break;
        if ((r = sd_bus_message_read_basic(m, 's', &v)) < 0) break;
        if ((r = sd_bus_message_exit_container(m)) < 0) break;
        if (n + 2 > cap) {
            char **grown = realloc(out, (2 * cap + 1) * sizeof(char *));
            if (!grown) { r = -ENOMEM; break; }
            out = grown;
            cap *= 2;
        }
        if (!(out[n] = strdup(k))) { r = -ENOMEM; break; }
        out[++n] = NULL;
        if (!(out[n] = strdup(v))) { r = -ENOMEM; break; }
        out[++n] = NULL;
    }
    if (r >= 0) r = sd_bus_message_exit_container(m);
    if (r < 0) { ssb_strv_free(out); return r; }
    *pairs = out;
    return 0;
}

void ssb_strv_free(char **strv) {
    if (!strv) return;
    for (char **p = strv; *p; p++) free(*p);
    free(strv);
}

int ssb_read_secret(ssb_message *m, const char **session, const void **parameters, size_t *parameters_size,
                    const void **value, size_t *value_size, const char **content_type) {
    int r = sd_bus_message_enter_container(m, 'r', "oayays");
    if (r >= 0) r = sd_bus_message_read_basic(m, 'o', session);
    if (r >= 0) r = sd_bus_message_read_array(m, 'y', parameters, parameters_size);
    if (r >= 0) r = sd_bus_message_read_array(m, 'y', value, value_size);
    if (r >= 0) r = sd_bus_message_read_basic(m, 's', content_type);
    if (r >= 0) r = sd_bus_message_exit_container(m);
    return r < 0 ? r : 0;
}

int ssb_enter_properties(ssb_message *m) { return sd_bus_message_enter_container(m, 'a', "{sv}"); }

int ssb_next_property(ssb_message *m, const char **key, const char **contents) {
    int r = sd_bus_message_enter_container(m, 'e', "sv");
    if (r == 0) return sd_bus_message_exit_container(m) < 0 ? -EBADMSG : 0;
    if (r < 0) return r;
    r = sd_bus_message_read_basic(m, 's', key);
    if (r < 0) return r;
    r = sd_bus_message_peek_type(m, NULL, contents);
    return r < 0 ? r : 1;
}

int ssb_read_variant_string(ssb_message *m, const char **value) {
    int r = sd_bus_message_enter_container(m, 'v', "s");
    if (r >= 0) r = sd_bus_message_read_basic(m, 's', value);
    if (r >= 0) r = sd_bus_message_exit_container(m);
    return r < 0 ? r : 0;
}

int ssb_read_variant_string_dict(ssb_message *m, char ***pairs) {
    *pairs = NULL;
    int r = sd_bus_message_enter_container(m, 'v', "a{ss}");
    if (r >= 0) r = ssb_read_string_dict(m, pairs);
    if (r >= 0) r = sd_bus_message_exit_container(m);
    if (r < 0) { ssb_strv_free(*pairs); *pairs = NULL; }
    return r < 0 ? r : 0;
}

int ssb_read_variant_bool(ssb_message *m, int *value) {
    int r = sd_bus_message_enter_container(m, 'v', "b");
    if (r >= 0) r = sd_bus_message_read_basic(m, 'b', value);
    if (r >= 0) r = sd_bus_message_exit_container(m);
    return r < 0 ? r : 0;
}

int ssb_skip_variant(ssb_message *m) { return sd_bus_message_skip(m, "v"); }

int ssb_end_property(ssb_message *m) { return sd_bus_message_exit_container(m); }

int ssb_new_reply(ssb_message *call, ssb_message **reply) { return sd_bus_message_new_method_return(call, reply); }

int ssb_send(ssb_message *reply) {
    int r = sd_bus_send(NULL, reply, NULL);
    sd_bus_message_unref(reply);
    return r;
}

void ssb_release(ssb_message *reply) { sd_bus_message_unref(reply); }

int ssb_append_string(ssb_message *m, char type, const char *value) { return sd_bus_message_append_basic(m, type, value); }

int ssb_append_bool(ssb_message *m, int value) { return sd_bus_message_append_basic(m, 'b', &value); }

int ssb_append_u64(ssb_message *m, uint64_t value) { return sd_bus_message_append_basic(m, 't', &value); }

int ssb_append_strings(ssb_message *m, char type, const char *const *items, size_t count) {
    char sig[2] = {type, 0};
    int r = sd_bus_message_open_container(m, 'a', sig);
    for (size_t i = 0; r >= 0 && i < count; i++) r = sd_bus_message_append_basic(m, type, items[i]);
    if (r >= 0) r = sd_bus_message_close_container(m);
    return r;
}

int ssb_append_string_dict(ssb_message *m, const char *const *keys, const char *const *values, size_t count) {
    int r = sd_bus_message_open_container(m, 'a', "{ss}");
    for (size_t i = 0; r >= 0 && i < count; i++) r = sd_bus_message_append(m, "{ss}", keys[i], values[i]);
    if (r >= 0) r = sd_bus_message_close_container(m);
    return r;
}

int ssb_append_secret(ssb_message *m, const char *session, const void *parameters, size_t parameters_size,
                      const void *value, size_t value_size, const char *content_type) {
    int r = sd_bus_message_open_container(m, 'r', "oayays");
    if (r >= 0) r = sd_bus_message_append_basic(m, 'o', session);
    if (r >= 0) r = sd_bus_message_append_array(m, 'y', parameters, parameters_size);
    if (r >= 0) r = sd_bus_message_append_array(m, 'y', value, value_size);
    if (r >= 0) r = sd_bus_message_append_basic(m, 's', content_type);
    if (r >= 0) r = sd_bus_message_close_container(m);
    return r;
}

int ssb_open_secrets(ssb_message *m) { return sd_bus_message_open_container(m, 'a', "{o(oayays)}"); }

int ssb_append_secrets_entry(ssb_message *m, const char *path, const char *session, const void *parameters,
                             size_t parameters_size, const void *value, size_t value_size, const char *content_type) {
    int r = sd_bus_message_open_container(m, 'e', "o(oayays)");
    if (r >= 0) r = sd_bus_message_append_basic(m, 'o', path);
    if (r >= 0) r = ssb_append_secret(m, session, parameters, parameters_size, value, value_size, content_type);
    if (r >= 0) r = sd_bus_message_close_container(m);
    return r;
}

int ssb_close_container(ssb_message *m) { return sd_bus_message_close_container(m); }

int ssb_error_set(ssb_error *error, const char *name, const char *text) { return sd_bus_error_set((sd_bus_error *)error, name, text); }

/* A signal addressed to `destination` alone. */
static int new_signal_to(ssb_bus *bus, sd_bus_message **m, const char *destination, const char *path, const char *interface,
                         const char *member) {
    int r = sd_bus_message_new_signal(bus, m, path, interface, member);
    if (r >= 0) r = sd_bus_message_set_destination(*m, destination);
    return r;
}

int ssb_emit_path_signal(ssb_bus *bus, const char *destination, const char *path, const char *interface,
                         const char *member, const char *object) {
    sd_bus_message *m = NULL;
    int r = new_signal_to(bus, &m, destination, path, interface, member);
    if (r >= 0) r = sd_bus_message_append_basic(m, 'o', object);
    if (r >= 0) r = sd_bus_send(bus, m, NULL);
    sd_bus_message_unref(m);
    return r;
}

/* The type of a property sent with its value; NULL for one sent as invalidated (its value grows
 * with the keychain: Items, Collections). */
static const char *changed_property_type(const char *name) {
    if (strcmp(name, "Locked") == 0) return "b";
    if (strcmp(name, "Modified") == 0 || strcmp(name, "Created") == 0) return "t";
    if (strcmp(name, "Label") == 0 || strcmp(name, "Type") == 0) return "s";
    if (strcmp(name, "Attributes") == 0) return "a{ss}";
    return NULL;
}

int ssb_emit_properties_changed(ssb_bus *bus, const ssb_handlers *handlers, const char *destination, const char *path,
                                const char *interface, char **names) {
    sd_bus_message *m = NULL;
    sd_bus_error error = SD_BUS_ERROR_NULL;
    int r = new_signal_to(bus, &m, destination, path, "org.freedesktop.DBus.Properties", "PropertiesChanged");
    if (r >= 0) r = sd_bus_message_append_basic(m, 's', interface);
    if (r >= 0) r = sd_bus_message_open_container(m, 'a', "{sv}");
    for (char **n = names; r >= 0 && *n; n++) {
        const char *type = changed_property_type(*n);
        if (!type) continue;
        r = sd_bus_message_open_container(m, 'e', "sv");
        if (r >= 0) r = sd_bus_message_append_basic(m, 's', *n);
        if (r >= 0) r = sd_bus_message_open_container(m, 'v', type);
        if (r >= 0) r = handlers->get_property(NULL, path, interface, *n, m, (ssb_error *)&error, handlers->userdata);
        if (r >= 0) r = sd_bus_message_close_container(m);
        if (r >= 0) r = sd_bus_message_close_container(m);
    }
    if (r >= 0) r = sd_bus_message_close_container(m);
    if (r >= 0) r = sd_bus_message_open_container(m, 'a', "s");
    for (char **n = names; r >= 0 && *n; n++) {
        if (!changed_property_type(*n)) r = sd_bus_message_append_basic(m, 's', *n);
    }
    if (r >= 0) r = sd_bus_message_close_container(m);
    if (r >= 0) r = sd_bus_send(bus, m, NULL);
    sd_bus_error_free(&error);
    sd_bus_message_unref(m);
    return r;
}

int ssb_emit_completed(ssb_bus *bus, const char *destination, const char *path, int dismissed, const char *const *paths,
                       size_t count) {
    sd_bus_message *m = NULL;
    int r = new_signal_to(bus, &m, destination, path, PROMPT_IFACE, "Completed");
    if (r >= 0) r = sd_bus_message_append_basic(m, 'b', &dismissed);
    if (r >= 0) r = sd_bus_message_open_container(m, 'v', "ao");
    if (r >= 0) r = ssb_append_strings(m, 'o', paths, count);
    if (r >= 0) r = sd_bus_message_close_container(m);
    if (r >= 0) r = sd_bus_send(bus, m, NULL);
    sd_bus_message_unref(m);
    return r;
}

int ssb_read_open_session(ssb_message *m, const char **algorithm, int *kind, const void **input, size_t *size) {
    *input = NULL;
    *size = 0;
    int r = sd_bus_message_read(m, "s", algorithm);
    if (r < 0) return r;
    const char *contents = NULL;
    r = sd_bus_message_peek_type(m, NULL, &contents);
    if (r < 0) return r;
    if (contents && strcmp(contents, "ay") == 0) {
        *kind = SSB_INPUT_BYTES;
        r = sd_bus_message_enter_container(m, 'v', "ay");
        if (r < 0) return r;
        r = sd_bus_message_read_array(m, 'y', input, size);
        if (r < 0) return r;
        return sd_bus_message_exit_container(m);
    }
    *kind = contents && strcmp(contents, "s") == 0 ? SSB_INPUT_STRING : SSB_INPUT_OTHER;
    return sd_bus_message_skip(m, "v");
}

int ssb_reply_open_session(ssb_message *m, int as_bytes, const void *output, size_t size, const char *path) {
    sd_bus_message *reply = NULL;
    int r = sd_bus_message_new_method_return(m, &reply);
    if (r >= 0) {
        if (as_bytes) {
            r = sd_bus_message_open_container(reply, 'v', "ay");
            if (r >= 0) r = sd_bus_message_append_array(reply, 'y', output, size);
            if (r >= 0) r = sd_bus_message_close_container(reply);
        } else {
            r = sd_bus_message_append(reply, "v", "s", "");
        }
    }
    if (r >= 0) r = sd_bus_message_append(reply, "o", path);
    if (r >= 0) r = sd_bus_send(NULL, reply, NULL);
    sd_bus_message_unref(reply);
    return r;
}

int ssb_reply_empty(ssb_message *m) { return sd_bus_reply_method_return(m, ""); }

int ssb_reply_error(ssb_message *m, const char *name, const char *text) {
    return sd_bus_reply_method_errorf(m, name, "%s", text);
}

int ssb_connection_credentials(ssb_bus *bus, const char *sender, uint32_t *pid, int *pidfd) {
    sd_bus_message *reply = NULL;
    sd_bus_error error = SD_BUS_ERROR_NULL;
    *pid = 0;
    *pidfd = -1;
    int r = sd_bus_call_method(bus, "org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus",
                               "GetConnectionCredentials", &error, &reply, "s", sender);
    if (r < 0) goto out;
    r = sd_bus_message_enter_container(reply, 'a', "{sv}");
    while (r >= 0 && (r = sd_bus_message_enter_container(reply, 'e', "sv")) > 0) {
        const char *key = NULL;
        r = sd_bus_message_read(reply, "s", &key);
        if (r < 0) break;
        if (strcmp(key, "ProcessID") == 0) {
            r = sd_bus_message_read(reply, "v", "u", pid);
        } else if (strcmp(key, "ProcessFD") == 0) {
            int fd = -1;
            r = sd_bus_message_read(reply, "v", "h", &fd);
            if (r >= 0 && *pidfd < 0) {
                *pidfd = fcntl(fd, F_DUPFD_CLOEXEC, 3);
                if (*pidfd < 0) r = -errno;
            }
        } else {
            r = sd_bus_message_skip(reply, "v");
        }
        if (r >= 0) r = sd_bus_message_exit_container(reply);
    }
    if (r >= 0) r = sd_bus_message_exit_container(reply);
out:
    if (r < 0 && *pidfd >= 0) { close(*pidfd); *pidfd = -1; }
    sd_bus_error_free(&error);
    sd_bus_message_unref(reply);
    return r < 0 ? r : 0;
}
