/* CSecretServicePortal: see include/CSecretServicePortal.h. */
#include "CSecretServicePortal.h"

#include <errno.h>
#include <string.h>
#include <systemd/sd-bus.h>

#define PORTAL_PATH "/org/freedesktop/portal/desktop"
#define SECRET_IFACE "org.freedesktop.impl.portal.Secret"

struct csp_context {
    const char *portal_name;
    csp_retrieve_fn retrieve;
    void *userdata;
};

/* The unique name owning `name` now, copied into `out` (size `size`); 0, or a negative errno
 * (-ENXIO when nobody owns it). */
static int name_owner(sd_bus *bus, const char *name, char *out, size_t size) {
    sd_bus_error error = SD_BUS_ERROR_NULL;
    sd_bus_message *reply = NULL;
    int r = sd_bus_call_method(bus, "org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus", "GetNameOwner",
                               &error, &reply, "s", name);
    if (r < 0) {
        sd_bus_error_free(&error);
        return -ENXIO;
    }
    const char *owner = NULL;
    r = sd_bus_message_read(reply, "s", &owner);
    if (r >= 0) {
        if (strlen(owner) >= size) {
            r = -ENAMETOOLONG;
        } else {
            strcpy(out, owner);
            r = 0;
        }
    }
    sd_bus_message_unref(reply);
    return r;
}

static int retrieve_cb(sd_bus_message *m, void *userdata, sd_bus_error *ret_error) {
    (void)ret_error;
    struct csp_context *c = userdata;
    const char *sender = sd_bus_message_get_sender(m);
    char owner[256];
    int known = name_owner(sd_bus_message_get_bus(m), c->portal_name, owner, sizeof owner) >= 0;
    const char *handle = NULL, *app_id = NULL;
    int fd = -1;
    int r = sd_bus_message_read(m, "osh", &handle, &app_id, &fd);
    if (r < 0) return r;
    r = sd_bus_message_skip(m, "a{sv}");
    if (r < 0) return r;
    /* Who may ask is the handler's decision (CofferSecretPortal); the wall only marshals. */
    uint32_t response = c->retrieve(sender, known ? owner : NULL, app_id, fd, c->userdata);
    if (response == CSP_ACCESS_DENIED) {
        return sd_bus_reply_method_errorf(m, SD_BUS_ERROR_ACCESS_DENIED,
                                          "only the owner of %s may ask for a portal secret", c->portal_name);
    }
    return sd_bus_reply_method_return(m, "ua{sv}", response, 0);
}

static int version_cb(sd_bus *bus, const char *path, const char *interface, const char *property, sd_bus_message *reply,
                      void *userdata, sd_bus_error *ret_error) {
    (void)bus; (void)path; (void)interface; (void)property; (void)userdata; (void)ret_error;
    return sd_bus_message_append(reply, "u", (uint32_t)1);
}

static const sd_bus_vtable secret_vtable[] = {
    SD_BUS_VTABLE_START(0),
    SD_BUS_METHOD_WITH_NAMES("RetrieveSecret", "osha{sv}", SD_BUS_PARAM(handle) SD_BUS_PARAM(app_id) SD_BUS_PARAM(fd) SD_BUS_PARAM(options),
                             "ua{sv}", SD_BUS_PARAM(response) SD_BUS_PARAM(results), retrieve_cb, SD_BUS_VTABLE_UNPRIVILEGED),
    SD_BUS_PROPERTY("version", "u", version_cb, 0, SD_BUS_VTABLE_PROPERTY_CONST),
    SD_BUS_VTABLE_END,
};

int csp_serve(const char *bus_name, const char *portal_name, csp_retrieve_fn retrieve, void *userdata) {
    struct csp_context context = { portal_name, retrieve, userdata };
    sd_bus *bus = NULL;
    int r = sd_bus_open_user(&bus);
    if (r < 0) return r;
    r = sd_bus_add_object_vtable(bus, NULL, PORTAL_PATH, SECRET_IFACE, secret_vtable, &context);
    if (r >= 0) {
        r = sd_bus_request_name(bus, bus_name, 0);
        if (r == -EEXIST) {
            sd_bus_flush_close_unref(bus);
            return CSP_NAME_TAKEN;
        }
    }
    while (r >= 0) {
        r = sd_bus_process(bus, NULL);
        if (r > 0) continue;
        if (r == 0) r = sd_bus_wait(bus, UINT64_MAX);
        if (r == -EINTR) r = 0;
    }
    if (r == -ECONNRESET || r == -ENOTCONN) r = 0;
    sd_bus_flush_close_unref(bus);
    return r;
}
