/* Coffer's passcode authenticator: checks the evaluation's credential (the passcode the person
 * typed, or the one the client gave in advance) through PAM, in the plugin host, so that the PAM
 * stack's modules never run inside the agent when the agent is configured to use it
 * (`passcode-verifier = plugin`).
 *
 * Configuration comes from the host's environment, set by the agent:
 *   COFFER_PAM_USER      the user to authenticate (required)
 *   COFFER_PAM_SERVICE   the PAM service (default "coffer")
 *   COFFER_PAM_CONFDIR   a private PAM configuration directory (pam_start_confdir), for tests
 *
 * Result: COFFER_LA_SUCCESS when pam_authenticate and pam_acct_mgmt both succeed,
 * COFFER_LA_AUTHENTICATION_FAILED otherwise (also without a credential). Copies of the credential are
 * wiped before they are freed. No enrollment, no control commands but `status`. */
#define _GNU_SOURCE
#include <coffer/coffer_plugin.h>
#include <security/pam_appl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct passcode_state {
    char user[256];
    char service[128];
    char confdir[1024];
    const struct coffer_host_v1 *host;
};

static void wipe(void *p, size_t n) {
    volatile unsigned char *v = p;
    while (n--) *v++ = 0;
}

static int copy_env(const char *name, char *out, size_t size, const char *fallback) {
    const char *v = getenv(name);
    if (v == NULL || *v == 0) v = fallback;
    if (v == NULL) return -1;
    if (strlen(v) >= size) return -1;
    strcpy(out, v);
    return 0;
}

static int passcode_init(const struct coffer_host_v1 *host, void **state) {
    struct passcode_state *s = calloc(1, sizeof *s);
    if (s == NULL) return COFFER_STATUS_FAILED;
    s->host = host;
    if (copy_env("COFFER_PAM_USER", s->user, sizeof s->user, NULL) != 0
        || copy_env("COFFER_PAM_SERVICE", s->service, sizeof s->service, "coffer") != 0
        || copy_env("COFFER_PAM_CONFDIR", s->confdir, sizeof s->confdir, "") != 0) {
        free(s);
        return COFFER_STATUS_FAILED;
    }
    *state = s;
    return COFFER_STATUS_OK;
}

static int passcode_enrollment_state(void *state, uint32_t *count, uint8_t domain[COFFER_DOMAIN_STATE_BYTES]) {
    (void)state;
    *count = 0;
    memset(domain, 0, COFFER_DOMAIN_STATE_BYTES);
    return COFFER_STATUS_UNSUPPORTED;
}

struct answer {
    const uint8_t *credential;
    size_t length;
};

/* Answers every hidden-input prompt with the credential; anything else gets no answer. */
static int conversation(int n, const struct pam_message **msg, struct pam_response **resp, void *data) {
    const struct answer *a = data;
    if (n <= 0 || n > PAM_MAX_NUM_MSG) return PAM_CONV_ERR;
    struct pam_response *r = calloc((size_t)n, sizeof *r);
    if (r == NULL) return PAM_BUF_ERR;
    for (int i = 0; i < n; i++) {
        if (msg[i]->msg_style == PAM_PROMPT_ECHO_OFF) {
            char *copy = malloc(a->length + 1);
            if (copy == NULL) {
                for (int j = 0; j < i; j++) if (r[j].resp) { wipe(r[j].resp, strlen(r[j].resp)); free(r[j].resp); }
                free(r);
                return PAM_BUF_ERR;
            }
            memcpy(copy, a->credential, a->length);
            copy[a->length] = 0;
            r[i].resp = copy; /* PAM wipes and frees it */
        }
    }
    *resp = r;
    return PAM_SUCCESS;
}

static int passcode_begin(void *state, const struct coffer_evaluation_v1 *e) {
    struct passcode_state *s = state;
    if (e->credential == NULL || e->credential_len == 0 || memchr(e->credential, 0, e->credential_len) != NULL)
        return COFFER_LA_AUTHENTICATION_FAILED;
    struct answer a = { e->credential, e->credential_len };
    struct pam_conv conv = { conversation, &a };
    pam_handle_t *h = NULL;
    int rc = s->confdir[0] ? pam_start_confdir(s->service, s->user, &conv, s->confdir, &h)
                           : pam_start(s->service, s->user, &conv, &h);
    if (rc != PAM_SUCCESS) {
        if (s->host && s->host->log) s->host->log(s->host->host_context, 2, "pam_start failed");
        return COFFER_LA_AUTHENTICATION_FAILED;
    }
    rc = pam_authenticate(h, PAM_SILENT);
    if (rc == PAM_SUCCESS) rc = pam_acct_mgmt(h, PAM_SILENT);
    pam_end(h, rc);
    return rc == PAM_SUCCESS ? COFFER_LA_SUCCESS : COFFER_LA_AUTHENTICATION_FAILED;
}

static void passcode_cancel(void *state, uint64_t id, int result) {
    (void)state; (void)id; (void)result; /* a PAM call is not interruptible; it ends on its own */
}

static int passcode_control(void *state, const char *command, const char *const *args, size_t argc,
                            char *reply, size_t reply_size) {
    struct passcode_state *s = state;
    (void)args;
    if (strcmp(command, "status") == 0 && argc == 0) {
        snprintf(reply, reply_size, "PAM service %s for %s%s", s->service, s->user, s->confdir[0] ? " (private configuration)" : "");
        return COFFER_STATUS_OK;
    }
    snprintf(reply, reply_size, "unknown command (status)");
    return COFFER_STATUS_UNKNOWN_COMMAND;
}

static void passcode_destroy(void *state) {
    wipe(state, sizeof(struct passcode_state));
    free(state);
}

static const struct coffer_plugin_v1 table = {
    .abi_version = COFFER_PLUGIN_ABI_VERSION,
    .struct_size = sizeof(struct coffer_plugin_v1),
    .name = "passcode",
    .description = "Coffer passcode authenticator (PAM)",
    .version = "1",
    .kind = COFFER_KIND_PASSCODE,
    .capabilities = COFFER_CAP_PASSCODE | COFFER_CAP_NEEDS_CREDENTIAL,
    .init = passcode_init,
    .enrollment_state = passcode_enrollment_state,
    .begin_evaluation = passcode_begin,
    .cancel = passcode_cancel,
    .control = passcode_control,
    .destroy = passcode_destroy,
};

__attribute__((visibility("default"))) const struct coffer_plugin_v1 *coffer_plugin_entry(void) { return &table; }
