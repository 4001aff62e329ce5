/* The floor under any Secret Service provider for secret-tool (contrib/bench/secret-service.sh): a
 * provider that stores nothing and answers every call from constants, with sd-bus. What `secret-tool
 * lookup` and `store` take against it is what the client, the bus and one provider process cost
 * without any keychain work: process start, GLib, the bus connection, the calls' round trips.
 *
 *   ss-floor        owns org.freedesktop.secrets on the session bus until the bus goes
 *
 * Answers: the Collections property (empty); OpenSession (plain only: libsecret asks for the DH
 * session first, both real providers agree one, and it falls back to plain on NotSupported); SearchItems (one item); GetSecrets ("secret-1" for each path); CreateItem (an item,
 * no prompt). */
#include <stdio.h>
#include <string.h>
#include <systemd/sd-bus.h>

#define ITEM "/org/freedesktop/secrets/collection/login/1"
#define SESSION "/org/freedesktop/secrets/session/1"

static int get_collections(sd_bus *bus, const char *path, const char *interface, const char *property,
                           sd_bus_message *reply, void *userdata, sd_bus_error *error) {
    (void)bus; (void)path; (void)interface; (void)property; (void)userdata; (void)error;
    return sd_bus_message_append(reply, "ao", 0);
}

static int open_session(sd_bus_message *m, void *userdata, sd_bus_error *error) {
    (void)userdata;
    const char *algorithm;
    int r = sd_bus_message_read(m, "s", &algorithm);
    if (r < 0) return r;
    /* libsecret asks for the DH session first and falls back to plain on NotSupported. */
    if (strcmp(algorithm, "plain") != 0) return sd_bus_error_set(error, SD_BUS_ERROR_NOT_SUPPORTED, "plain only");
    return sd_bus_reply_method_return(m, "vo", "s", "", SESSION);
}

static int search_items(sd_bus_message *m, void *userdata, sd_bus_error *error) {
    (void)userdata; (void)error;
    return sd_bus_reply_method_return(m, "aoao", 1, ITEM, 0);
}

static int get_secrets(sd_bus_message *m, void *userdata, sd_bus_error *error) {
    (void)userdata; (void)error;
    const char *path;
    sd_bus_message *reply = NULL;
    int r = sd_bus_message_new_method_return(m, &reply);
    if (r >= 0) r = sd_bus_message_open_container(reply, 'a', "{o(oayays)}");
    if (r >= 0) r = sd_bus_message_enter_container(m, 'a', "o");
    while (r >= 0 && (r = sd_bus_message_read(m, "o", &path)) > 0) {
        r = sd_bus_message_open_container(reply, 'e', "o(oayays)");
        if (r >= 0) r = sd_bus_message_append(reply, "o", path);
        if (r >= 0) r = sd_bus_message_open_container(reply, 'r', "oayays");
        if (r >= 0) r = sd_bus_message_append(reply, "o", SESSION);
        if (r >= 0) r = sd_bus_message_append_array(reply, 'y', "", 0);
        if (r >= 0) r = sd_bus_message_append_array(reply, 'y', "secret-1", 8);
        if (r >= 0) r = sd_bus_message_append(reply, "s", "text/plain");
        if (r >= 0) r = sd_bus_message_close_container(reply);
        if (r >= 0) r = sd_bus_message_close_container(reply);
    }
    if (r >= 0) r = sd_bus_message_close_container(reply);
    if (r >= 0) r = sd_bus_send(NULL, reply, NULL);
    sd_bus_message_unref(reply);
    return r;
}

static int create_item(sd_bus_message *m, void *userdata, sd_bus_error *error) {
    (void)userdata; (void)error;
    return sd_bus_reply_method_return(m, "oo", ITEM, "/");
}

static const sd_bus_vtable service[] = {
    SD_BUS_VTABLE_START(0),
    SD_BUS_PROPERTY("Collections", "ao", get_collections, 0, 0),
    SD_BUS_METHOD("OpenSession", "sv", "vo", open_session, 0),
    SD_BUS_METHOD("SearchItems", "a{ss}", "aoao", search_items, 0),
    SD_BUS_METHOD("GetSecrets", "aoo", "a{o(oayays)}", get_secrets, 0),
    SD_BUS_VTABLE_END
};

static const sd_bus_vtable collection[] = {
    SD_BUS_VTABLE_START(0),
    SD_BUS_METHOD("CreateItem", "a{sv}(oayays)b", "oo", create_item, 0),
    SD_BUS_VTABLE_END
};

int main(void) {
    sd_bus *bus = NULL;
    int r = sd_bus_open_user(&bus);
    if (r >= 0) r = sd_bus_add_object_vtable(bus, NULL, "/org/freedesktop/secrets", "org.freedesktop.Secret.Service", service, NULL);
    if (r >= 0) r = sd_bus_add_fallback_vtable(bus, NULL, "/org/freedesktop/secrets/aliases", "org.freedesktop.Secret.Collection", collection, NULL, NULL);
    if (r >= 0) r = sd_bus_add_fallback_vtable(bus, NULL, "/org/freedesktop/secrets/collection", "org.freedesktop.Secret.Collection", collection, NULL, NULL);
    if (r >= 0) r = sd_bus_request_name(bus, "org.freedesktop.secrets", 0);
    if (r < 0) { fprintf(stderr, "ss-floor: %s\n", strerror(-r)); return 1; }
    for (;;) {
        r = sd_bus_process(bus, NULL);
        if (r < 0) break;
        if (r > 0) continue;
        if (sd_bus_wait(bus, (uint64_t)-1) < 0) break;
    }
    sd_bus_unref(bus);
    return 0;
}
