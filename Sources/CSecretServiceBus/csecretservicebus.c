/* The sd-bus wall of the Secret Service front end: see include/CSecretServiceBus.h. */
#include "CSecretServiceBus.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <systemd/sd-bus.h>
#include <unistd.h>

#define SERVICE_IFACE "org.freedesktop.Secret.Service"
#define SESSION_IFACE "org.freedesktop.Secret.Session"

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

int ssb_bus_run(ssb_bus *bus) {
    for (;;) {
        int r = sd_bus_process(bus, NULL);
        if (r == -ECONNRESET || r == -ENOTCONN) return 0;
        if (r < 0) return r;
        if (r > 0) continue;
        r = sd_bus_wait(bus, UINT64_MAX);
        if (r < 0 && r != -EINTR) return r;
    }
}

const char *ssb_message_sender(ssb_message *m) { return sd_bus_message_get_sender(m); }
const char *ssb_message_path(ssb_message *m) { return sd_bus_message_get_path(m); }

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
