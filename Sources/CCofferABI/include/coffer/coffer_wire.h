/*
 * coffer_wire.h -- the constants of Coffer's wire protocol, versions 1 to 4, for C clients: pam_coffer
 * and, later, authenticator plugins and bridges. The specification is
 * Sources/CofferProtocol/CofferProtocol.docc/WireProtocol.md; the Swift constants are in
 * CofferProtocol (WireFormat, MessageType) and CofferModel (SecStatus). A test
 * (Tests/CofferABITests) checks every value here against them, so the two cannot drift.
 *
 * Header only, no declarations that need linking: include it from plain C with no Swift runtime.
 */
#ifndef COFFER_WIRE_H
#define COFFER_WIRE_H

/* Protocol versions this header describes: the highest, and the lowest an agent still speaks (a C
 * client that needs nothing of versions 2 to 4 announces COFFER_WIRE_MIN_VERSION..COFFER_WIRE_VERSION,
 * and keeps its frames within COFFER_MAX_BODY_BYTES, which holds at every version). */
#define COFFER_WIRE_VERSION 4
#define COFFER_WIRE_MIN_VERSION 1

/* Frames: u32 big-endian body length, then body = u8 type || u32 request id || payload. */
#define COFFER_MIN_BODY_BYTES 5
#define COFFER_MAX_BODY_BYTES (256 * 1024)
/* At version 4 (COFFER_LARGE_FRAMES_VERSION) and later, frames up to this, both ways. */
#define COFFER_LARGE_FRAMES_VERSION 4
#define COFFER_MAX_LARGE_BODY_BYTES (1536 * 1024)
#define COFFER_MAX_SECRET_BYTES (1024 * 1024)
#define COFFER_PERSISTENT_REF_BYTES 16

/* Message types (never renumbered). */
#define COFFER_MSG_HELLO 0x01
#define COFFER_MSG_STATUS 0x02
#define COFFER_MSG_UNLOCK 0x03
#define COFFER_MSG_LOCK 0x04
#define COFFER_MSG_SET_PASSCODE 0x05
#define COFFER_MSG_ADD 0x06
#define COFFER_MSG_COPY_MATCHING 0x07
#define COFFER_MSG_UPDATE 0x08
#define COFFER_MSG_DELETE 0x09
#define COFFER_MSG_SUBSCRIBE 0x0A
#define COFFER_MSG_COPY_MATCHING_PAGE 0x0B
#define COFFER_MSG_WHOAMI 0x0C
#define COFFER_MSG_AUTHORIZE 0x0D
#define COFFER_MSG_AUTH_OPTIONS 0x0E
#define COFFER_MSG_AUTH_RESPONSE 0x0F
#define COFFER_MSG_LA_EVALUATE 0x10
#define COFFER_MSG_LA_CAN_EVALUATE 0x11
#define COFFER_MSG_BIO 0x12
#define COFFER_MSG_PASSCODE_SYNC 0x13
#define COFFER_MSG_REMOVE_PASSCODE 0x14
#define COFFER_MSG_ESCROW 0x15
#define COFFER_MSG_BACKUP 0x16
#define COFFER_MSG_CHECK 0x17
#define COFFER_MSG_CHECK_PAGE 0x18
#define COFFER_MSG_KEY_CREATE 0x19
#define COFFER_MSG_DELEGATE 0x1A /* a front end's first request: the pidfd it passes (SCM_RIGHTS) is the caller */
#define COFFER_MSG_PROTECTIONS 0x1B /* which protections are active: device key, attempt counting, rollback detection */
#define COFFER_MSG_PROMPT_UNLOCK 0x1C /* a delegated connection: the agent asks the passcode with its own pinentry and unlocks */
#define COFFER_MSG_PROMPT_READ 0x22 /* a delegated connection: COPY_MATCHING, the items' access controls answered by the agent's own prompter */
#define COFFER_MSG_SUBSCRIBE_EVENTS 0x23 /* u8 topics: bit 0 lock events, bit 1 item changes, bit 2 with their groups (delegate-identity only) */
#define COFFER_MSG_FILES 0x24 /* protected directories: protect, status, lock all */
#define COFFER_MSG_PORTAL_SECRET 0x1D /* the portal secret backend (entitlement portal-secret): a Flatpak app's per-app secret */
#define COFFER_MSG_SYNC_SETUP 0x1E /* keychain sync (the owner's coffer only): init or join a circle on a git remote */
#define COFFER_MSG_SYNC_CIRCLE 0x1F /* keychain sync: approve a pairing code, remove a device, list the devices */
#define COFFER_MSG_SYNC_STATUS 0x20 /* keychain sync: the background sync's state (or sync now, then the state) */
#define COFFER_MSG_SYNC_CONFLICTS 0x21 /* keychain sync: the conflicts kept */
#define COFFER_MSG_PROMPTER 0x25 /* the agent's own prompter: its pinentry and why, the display its dialogs appear on */
#define COFFER_MSG_COUNTERS 0x26 /* what the agent has done since it started: connections, requests, identity resolutions, searches */
#define COFFER_MSG_KEY_SIGN 0x27 /* a signature by a key item made in the agent, its access control answered on this connection */
#define COFFER_MSG_SESSION 0x28 /* pam_coffer: u8 event, 1 a login session of the user opened, 2 one closed (the last: lock) */
#define COFFER_MSG_NOTE_ACCESS 0x29 /* a delegated front end: u8 operation (1 add, 2 get, 3 update, 4 delete, 5 find) of an item it holds itself */
#define COFFER_SESSION_OPENED 1
#define COFFER_SESSION_CLOSED 2
#define COFFER_MSG_OK 0x80
#define COFFER_MSG_HELLO_REPLY 0x81
#define COFFER_MSG_STATUS_REPLY 0x82
#define COFFER_MSG_ITEMS 0x87
#define COFFER_MSG_COUNT 0x88
#define COFFER_MSG_ITEMS_PAGE 0x89
#define COFFER_MSG_WHOAMI_REPLY 0x8A
#define COFFER_MSG_AUTH_NEEDED 0x8B
#define COFFER_MSG_AUTH_FEEDBACK 0x8C
#define COFFER_MSG_AUTH_FEEDBACK_KIND 0x91 /* version 2 */
#define COFFER_MSG_LA_RESULT 0x8D
#define COFFER_MSG_BIO_STATUS 0x8E
#define COFFER_MSG_ESCROW_SECRET 0x8F
#define COFFER_MSG_BACKUP_SUMMARY 0x90
#define COFFER_MSG_CHECK_REPORT 0x92
#define COFFER_MSG_ITEMS_PAGE_SKIPPING 0x93
#define COFFER_MSG_CHECK_REPORT_PAGE 0x94
#define COFFER_MSG_PROTECTIONS_REPLY 0x95
#define COFFER_MSG_PORTAL_SECRET_REPLY 0x97
#define COFFER_MSG_SYNC_CODE 0x98
#define COFFER_MSG_SYNC_DEVICES 0x99
#define COFFER_MSG_SYNC_STATUS_REPLY 0x9A
#define COFFER_MSG_SYNC_CONFLICTS_REPLY 0x9B
#define COFFER_MSG_FILES_REPLY 0x9C
#define COFFER_MSG_PROMPTER_REPLY 0x9D
#define COFFER_MSG_COUNTERS_REPLY 0x9E
#define COFFER_MSG_KEY_SIGNATURE 0x9F
#define COFFER_MSG_EVENT 0xC0
#define COFFER_MSG_ERROR 0xFF

/* Result codes an ERROR reply carries (Apple's OSStatus values, never renumbered). */
#define COFFER_ERR_SUCCESS 0
#define COFFER_ERR_UNIMPLEMENTED (-4)
#define COFFER_ERR_IO (-36)
#define COFFER_ERR_PARAM (-50)
#define COFFER_ERR_ALLOCATE (-108)
#define COFFER_ERR_USER_CANCELED (-128)
#define COFFER_ERR_INTERNAL_COMPONENT (-2070)
#define COFFER_ERR_NOT_AVAILABLE (-25291)
#define COFFER_ERR_AUTH_FAILED (-25293)
#define COFFER_ERR_DUPLICATE_ITEM (-25299)
#define COFFER_ERR_ITEM_NOT_FOUND (-25300)
#define COFFER_ERR_INTERACTION_NOT_ALLOWED (-25308)
#define COFFER_ERR_DECODE (-26275)
#define COFFER_ERR_MISSING_ENTITLEMENT (-34018)

#endif
