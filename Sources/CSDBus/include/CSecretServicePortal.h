/*
 * CSecretServicePortal (in the CSDBus target): the thin C wall between CofferSecretPortal and
 * sd-bus (libsystemd) for the desktop portal's secret backend (issue #26, part 6). One fixed D-Bus
 * signature: the backend's org.freedesktop.impl.portal.Secret.RetrieveSecret(o handle, s app_id,
 * h fd, a{sv} options) → (u response, a{sv} results). All marshalling is sd-bus's. Only
 * CofferSecretPortal calls it (CSDBus.h has the wall's rule).
 */
#ifndef CSECRETSERVICEPORTAL_H
#define CSECRETSERVICEPORTAL_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** What csp_serve returns besides 0 (the bus connection ended) and a negative errno. */
#define CSP_NAME_TAKEN 1

/** What a csp_retrieve_fn returns to refuse the call with org.freedesktop.DBus.Error.AccessDenied. */
#define CSP_ACCESS_DENIED UINT32_MAX

/** Answers one RetrieveSecret: `sender` is the call's sender (NULL if sd-bus gives none), `portal_owner`
 *  the current owner of the portal's name (NULL if it has none or the bus cannot say), `app_id` as the
 *  portal sent it (not yet validated), `fd` the descriptor to write the secret to (owned by the
 *  message: the handler MUST NOT close it). The handler decides whether the sender may ask (the
 *  wall only marshals): it returns the portal response code (0 success, 1 cancelled, 2 other
 *  error), or CSP_ACCESS_DENIED. */
typedef uint32_t (*csp_retrieve_fn)(const char *sender, const char *portal_owner, const char *app_id, int fd, void *userdata);

/** Connects to the session bus (DBUS_SESSION_BUS_ADDRESS, else $XDG_RUNTIME_DIR/bus), serves
 *  org.freedesktop.impl.portal.Secret at /org/freedesktop/portal/desktop, owns `bus_name` (never
 *  replacing or queueing behind another owner) and serves until the connection ends; each call goes
 *  to `retrieve` with its sender and the current owner of `portal_name`. Returns 0 when the
 *  connection ended, CSP_NAME_TAKEN when another process owns `bus_name`, or a negative errno. */
int csp_serve(const char *bus_name, const char *portal_name, csp_retrieve_fn retrieve, void *userdata);

#ifdef __cplusplus
}
#endif

#endif
