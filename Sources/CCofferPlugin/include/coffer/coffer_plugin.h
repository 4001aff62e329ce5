/*
 * coffer_plugin.h — the C ABI of Coffer authenticator plugins, version 1.
 *
 * A plugin is a shared object (`*.so`) that the plugin host (`coffer-plugin-host`, a separate,
 * non-dumpable process holding no class keys and no keychain) loads with
 * dlopen(RTLD_NOW | RTLD_LOCAL) and asks for ONE symbol:
 *
 *     const struct coffer_plugin_v1 *coffer_plugin_entry(void);
 *
 * The agent (`cofferd`) never loads plugins itself; it talks to the host over a socket pair
 * (PluginProtocol.md). Plugins are plain C (or anything exporting this C ABI): a plugin written
 * in Swift would bring a second Swift runtime into the host; do not.
 *
 * Conventions used below
 *  - "in" strings are NUL-terminated UTF-8 owned by the host, valid only for the duration of the
 *    call: copy what you need to keep.
 *  - "out" buffers are owned by the host and have the documented size; a plugin never frees
 *    anything the host gave it and the host never frees anything the plugin returned.
 *  - The table returned by coffer_plugin_entry and every string it points to are owned by the
 *    plugin and MUST stay valid and unchanged until the library is unloaded (static storage).
 *
 * What a plugin MUST NOT do (the host runs every plugin in one process):
 *  - call exit/_exit/abort or raise signals on purpose, install signal handlers, fork, exec,
 *    change the process's credentials, umask, working directory, rlimits or dumpable flag;
 *  - write to stdout or to file descriptor 3 (the host's protocol socket) or close descriptors
 *    it did not open; log through host->log (the host writes stderr);
 *  - block in any function other than begin_evaluation (init, enrollment_state, control, cancel
 *    and destroy return promptly: the host has no deadline for them other than killing itself);
 *  - log or persist credentials (passcodes, application passwords): they arrive in a buffer the
 *    host wipes after begin_evaluation returns;
 *  - keep pointers to host memory after the call that received them returns.
 * A plugin that crashes or hangs takes the host down with it: the agent fails the pending
 * evaluations (systemCancel), kills and restarts the host, and keeps serving.
 */
#ifndef COFFER_PLUGIN_H
#define COFFER_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** The ABI version this header describes. A host refuses a table with another abi_version. */
#define COFFER_PLUGIN_ABI_VERSION 1
/** The one symbol a plugin exports. */
#define COFFER_PLUGIN_ENTRY_SYMBOL "coffer_plugin_entry"
/** Bytes of an enrollment domain state (like LAContext.evaluatedPolicyDomainState). */
#define COFFER_DOMAIN_STATE_BYTES 32
/** Size of the reply buffer control() receives, terminating NUL included. */
#define COFFER_CONTROL_REPLY_BYTES 1024
/** Longest plugin name: [A-Za-z0-9._-], 1...64 bytes, unique among loaded plugins. */
#define COFFER_PLUGIN_NAME_MAX 64

/** What a plugin authenticates (coffer_plugin_v1.kind: exactly one). */
enum coffer_plugin_kind {
    COFFER_KIND_USER_PRESENCE = 1,        /* "someone is there" (a button, a test) */
    COFFER_KIND_BIOMETRY = 2,             /* a fingerprint or face sensor */
    COFFER_KIND_PASSCODE = 3,             /* the device passcode (the login password, PAM) */
    COFFER_KIND_APPLICATION_PASSWORD = 4, /* a per-item application password */
};

/** What a plugin can satisfy (coffer_plugin_v1.capabilities: a bit set). */
enum coffer_plugin_capability {
    COFFER_CAP_USER_PRESENCE = 1u << 0,
    COFFER_CAP_BIOMETRY = 1u << 1,
    COFFER_CAP_PASSCODE = 1u << 2,
    COFFER_CAP_APPLICATION_PASSWORD = 1u << 3,
    /** begin_evaluation needs evaluation->credential (a passcode or password). */
    COFFER_CAP_NEEDS_CREDENTIAL = 1u << 4,
    /** begin_evaluation waits for a person (a touch) and honours cancel(). */
    COFFER_CAP_INTERACTIVE = 1u << 5,
};
/** Every defined capability bit; a host refuses a table with any other bit set. */
#define COFFER_CAP_ALL 0x3Fu

/** Results of begin_evaluation: LocalAuthentication's LAError codes. Any other value is
 *  reported to the agent as COFFER_LA_AUTHENTICATION_FAILED (and logged by the host). */
enum coffer_la_result {
    COFFER_LA_SUCCESS = 0,
    COFFER_LA_AUTHENTICATION_FAILED = -1, /* wrong finger, wrong passcode */
    COFFER_LA_USER_CANCEL = -2,           /* the person cancelled (a CANCEL with reason user) */
    COFFER_LA_USER_FALLBACK = -3,         /* the person asked for the passcode instead */
    COFFER_LA_SYSTEM_CANCEL = -4,         /* the deadline passed, or the agent cancelled */
    COFFER_LA_PASSCODE_NOT_SET = -5,
    COFFER_LA_BIOMETRY_NOT_AVAILABLE = -6,
    COFFER_LA_BIOMETRY_NOT_ENROLLED = -7,
    COFFER_LA_BIOMETRY_LOCKOUT = -8,
};

/** Results of init, enrollment_state and control. */
enum coffer_status {
    COFFER_STATUS_OK = 0,
    COFFER_STATUS_FAILED = 1,          /* the operation failed (reply text says why) */
    COFFER_STATUS_UNKNOWN_COMMAND = 2, /* control: no such command */
    COFFER_STATUS_BAD_ARGUMENTS = 3,   /* control: wrong number or form of arguments */
    COFFER_STATUS_UNSUPPORTED = 4,     /* the plugin has no enrollment state */
};

/** Log levels for coffer_host_v1.log. */
enum coffer_log_level { COFFER_LOG_ERROR = 0, COFFER_LOG_WARNING = 1, COFFER_LOG_INFO = 2, COFFER_LOG_DEBUG = 3 };

/**
 * What the host gives init(). Owned by the host; valid until destroy() returns (the plugin may keep
 * the pointer). Fields may be appended in later versions: read struct_size before a field past it.
 */
struct coffer_host_v1 {
    uint32_t abi_version; /* COFFER_PLUGIN_ABI_VERSION */
    uint32_t struct_size; /* sizeof(struct coffer_host_v1) as the host knows it */
    /** Writes one line to the host's log (stderr, prefixed with the plugin's name). Thread-safe;
     *  `message` is copied; control characters are escaped. Never log credentials. */
    void (*log)(void *host_context, int level, const char *message);
    void *host_context;   /* pass back to log() */
    /** A private directory for this plugin's state (mode 0700, created by the host, one per
     *  plugin name). Write files there with mode 0600, atomically (temp file + rename). */
    const char *state_dir;
};

/** One evaluation. Owned by the host; valid only during begin_evaluation. */
struct coffer_evaluation_v1 {
    uint32_t struct_size;      /* sizeof(struct coffer_evaluation_v1) as the host knows it */
    uint32_t timeout_ms;       /* the plugin gives up after this (returns COFFER_LA_SYSTEM_CANCEL) */
    uint64_t id;               /* unique among running evaluations; cancel() names it */
    const char *reason;        /* the operation prompt shown to the person (not empty) */
    const char *app_name;      /* the calling app as the agent identified it */
    /** The credential (passcode, application password) or NULL with credential_len 0. Host-owned
     *  secure memory, wiped after begin_evaluation returns: never copy it to unwiped memory. */
    const uint8_t *credential;
    size_t credential_len;
    /** Optional progress messages ("try again", "finger not recognised"), relayed to the person;
     *  may be NULL. Call only from inside begin_evaluation, from any thread. */
    void (*feedback)(void *feedback_context, const char *text);
    void *feedback_context;
};

/** The table coffer_plugin_entry returns. */
struct coffer_plugin_v1 {
    uint32_t abi_version; /* MUST be COFFER_PLUGIN_ABI_VERSION */
    uint32_t struct_size; /* MUST be sizeof(struct coffer_plugin_v1) (the host refuses a smaller one) */
    const char *name;         /* unique name, [A-Za-z0-9._-]{1,64}: the protocol's plugin name */
    const char *description;  /* one line for people; may be NULL */
    const char *version;      /* the plugin's own version string; may be NULL */
    uint32_t kind;            /* enum coffer_plugin_kind */
    uint32_t capabilities;    /* enum coffer_plugin_capability bits */

    /** Called once, after loading, before anything else. Stores the plugin's state in *state (or
     *  NULL). Non-zero refuses the plugin (logged, then the library is unloaded). */
    int (*init)(const struct coffer_host_v1 *host, void **state);

    /** The enrolled set: *enrolled_count and a domain state that changes whenever the set changes
     *  (enroll or remove), never otherwise; all-zero bytes when nothing is enrolled is allowed.
     *  COFFER_STATUS_UNSUPPORTED for plugins without enrollment (passcode). Any thread, concurrently. */
    int (*enrollment_state)(void *state, uint32_t *enrolled_count, uint8_t domain_state[COFFER_DOMAIN_STATE_BYTES]);

    /** Runs one evaluation and blocks until it has a result, the deadline passes (return
     *  COFFER_LA_SYSTEM_CANCEL) or cancel() names it. Runs on a thread of its own; the host runs at
     *  most one evaluation per plugin at a time, while control/cancel/enrollment_state may be called
     *  from other threads. Returns an enum coffer_la_result. */
    int (*begin_evaluation)(void *state, const struct coffer_evaluation_v1 *evaluation);

    /** Makes the running evaluation `evaluation_id` return `result` (COFFER_LA_USER_CANCEL or
     *  COFFER_LA_SYSTEM_CANCEL) soon. Called from another thread while begin_evaluation blocks; a
     *  cancel for an id that is not running (finished, or not started) is ignored. The host repeats
     *  the call every 50 ms until begin_evaluation returns, so it must be idempotent. May be NULL for a
     *  plugin whose evaluations never block (the host then waits for the result). */
    void (*cancel)(void *state, uint64_t evaluation_id, int result);

    /** A text command with arguments (`coffer bio enroll NAME` → command "enroll", args {"NAME"}).
     *  Writes a NUL-terminated reply of at most reply_size bytes (COFFER_CONTROL_REPLY_BYTES) into
     *  `reply` and returns an enum coffer_status. May be NULL (every command is then unknown). */
    int (*control)(void *state, const char *command, const char *const *args, size_t argc,
                   char *reply, size_t reply_size);

    /** Frees the state; called once, with no other call running, before the library is unloaded.
     *  May be NULL. */
    void (*destroy)(void *state);
};

/** The type of the entry symbol. */
typedef const struct coffer_plugin_v1 *(*coffer_plugin_entry_fn)(void);

/** Declared for plugins: define it with default visibility. */
const struct coffer_plugin_v1 *coffer_plugin_entry(void);

#ifdef __cplusplus
}
#endif

#endif /* COFFER_PLUGIN_H */
