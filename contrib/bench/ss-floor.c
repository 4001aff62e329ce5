/* The floor under any Secret Service provider for secret-tool (contrib/bench/secret-service.sh): a
 * provider that stores nothing and answers every call from constants, with sd-bus. What `secret-tool
 * lookup` and `store` take against it is what the client, the bus and one provider process cost
 * without any keychain work: process start, GLib, the bus connection, the calls' round trips.
 *
 *   ss-floor [--dh]   owns org.freedesktop.secrets on the session bus until the bus goes (--dh: built
 *                     with -DSS_FLOOR_DH and the C wall, see secret-service.sh)
 *
 * Answers: the Collections property (empty); OpenSession (plain only: libsecret asks for the DH
 * session first, both real providers agree one, and it falls back to plain on NotSupported); SearchItems (one item); GetSecrets ("secret-1" for each path); CreateItem (an item,
 * no prompt).
 * With --dh it also agrees libsecret's first choice, the dh-ietf1024-sha256-aes128-cbc-pkcs7 session,
 * through Coffer's own C wall over OpenSSL (CSecretServiceCrypto.h in COpenSSL: the same key agreement, HKDF and
 * AES-CBC as coffer-secret-service, its key pair made ahead as Coffer's is), and answers GetSecrets
 * with "secret-1" encrypted for that session: the floor under a provider that speaks the DH session,
 * as Coffer and gnome-keyring both do (libsecret then does its own half of the agreement, which the
 * plain floor never asks it to). One session at a time (the benchmark's clients come one by one).
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <systemd/sd-bus.h>

#ifdef SS_FLOOR_DH
#include "CSecretServiceCrypto.h"
static int dh; /* --dh given */
static uint8_t priv[CSS_DH_BYTES], pub[CSS_DH_BYTES], key[CSS_AES_KEY_BYTES];
static int have_pair, have_key;
#endif

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
#ifdef SS_FLOOR_DH
    if (dh && strcmp(algorithm, "dh-ietf1024-sha256-aes128-cbc-pkcs7") == 0) {
        const void *input = NULL;
        size_t size = 0;
        uint8_t shared[CSS_DH_BYTES];
        r = sd_bus_message_enter_container(m, 'v', "ay");
        if (r >= 0) r = sd_bus_message_read_array(m, 'y', &input, &size);
        if (r < 0) return r;
        if (!have_pair && css_dh_generate(priv, sizeof priv, pub, sizeof pub) != CSS_OK)
            return sd_bus_error_set(error, SD_BUS_ERROR_FAILED, "key generation");
        have_pair = 0; /* one session per pair: the loop makes the next one */
        css_bytes x = { priv, sizeof priv }, y = { pub, sizeof pub }, peer = { input, size };
        if (css_dh_shared_secret_pair(x, y, peer, shared, sizeof shared) != CSS_OK
            || css_hkdf_sha256((css_bytes){ shared, sizeof shared }, key, sizeof key) != CSS_OK)
            return sd_bus_error_set(error, SD_BUS_ERROR_INVALID_ARGS, "bad public value");
        have_key = 1;
        sd_bus_message *reply = NULL;
        r = sd_bus_message_new_method_return(m, &reply);
        if (r >= 0) r = sd_bus_message_open_container(reply, 'v', "ay");
        if (r >= 0) r = sd_bus_message_append_array(reply, 'y', pub, sizeof pub);
        if (r >= 0) r = sd_bus_message_close_container(reply);
        if (r >= 0) r = sd_bus_message_append(reply, "o", SESSION);
        if (r >= 0) r = sd_bus_send(NULL, reply, NULL);
        sd_bus_message_unref(reply);
        return r;
    }
#endif
    /* libsecret asks for the DH session first and falls back to plain on NotSupported. */
    if (strcmp(algorithm, "plain") != 0) return sd_bus_error_set(error, SD_BUS_ERROR_NOT_SUPPORTED, "plain only");
#ifdef SS_FLOOR_DH
    have_key = 0;
#endif
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
#ifdef SS_FLOOR_DH
        if (have_key) {
            uint8_t iv[CSS_AES_BLOCK_BYTES], sealed[32];
            size_t sealed_len = 0;
            if (r >= 0 && (getrandom(iv, sizeof iv, 0) != (ssize_t)sizeof iv
                           || css_aes128_cbc_encrypt((css_bytes){ key, sizeof key }, (css_bytes){ iv, sizeof iv },
                                                     (css_bytes){ (const uint8_t *)"secret-1", 8 }, sealed, sizeof sealed, &sealed_len) != CSS_OK))
                r = -EIO;
            if (r >= 0) r = sd_bus_message_append_array(reply, 'y', iv, sizeof iv);
            if (r >= 0) r = sd_bus_message_append_array(reply, 'y', sealed, sealed_len);
        } else
#endif
        {
            if (r >= 0) r = sd_bus_message_append_array(reply, 'y', "", 0);
            if (r >= 0) r = sd_bus_message_append_array(reply, 'y', "secret-1", 8);
        }
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

int main(int argc, char **argv) {
    sd_bus *bus = NULL;
#ifdef SS_FLOOR_DH
    dh = argc > 1 && strcmp(argv[1], "--dh") == 0;
#else
    (void)argc; (void)argv;
#endif
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
#ifdef SS_FLOOR_DH
        /* The next session's key pair while nothing waits, as coffer-secret-service does. */
        if (dh && !have_pair) have_pair = css_dh_generate(priv, sizeof priv, pub, sizeof pub) == CSS_OK;
#endif
        if (sd_bus_wait(bus, (uint64_t)-1) < 0) break;
    }
    sd_bus_unref(bus);
    return 0;
}
