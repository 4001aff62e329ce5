import CCofferABI
import CofferModel
import CofferProtocol
import Testing

/// `coffer/coffer_wire.h` (what pam_coffer and C plugins compile against) says what the Swift
/// protocol module says, value for value.
@Suite struct WireHeaderTests {
    @Test func framingConstantsMatch() {
        #expect(Int(COFFER_WIRE_VERSION) == Int(WireFormat.version))
        #expect(Int(COFFER_WIRE_MIN_VERSION) == Int(WireFormat.minimumVersion))
        #expect(Int(COFFER_MIN_BODY_BYTES) == WireFormat.minimumBodyBytes)
        #expect(Int(COFFER_MAX_BODY_BYTES) == WireFormat.maximumBodyBytes)
        #expect(Int(COFFER_MAX_SECRET_BYTES) == WireFormat.maximumSecretBytes)
        #expect(Int(COFFER_LARGE_FRAMES_VERSION) == Int(WireFormat.largeFramesVersion))
        #expect(Int(COFFER_MAX_LARGE_BODY_BYTES) == WireFormat.maximumLargeBodyBytes)
        #expect(Int(COFFER_PERSISTENT_REF_BYTES) == WireFormat.persistentRefBytes)
    }

    @Test func everyMessageTypeHasItsHeaderConstant() {
        let header: [(Int32, MessageType)] = [
            (COFFER_MSG_HELLO, .hello), (COFFER_MSG_STATUS, .status), (COFFER_MSG_UNLOCK, .unlock),
            (COFFER_MSG_LOCK, .lock), (COFFER_MSG_SET_PASSCODE, .setPasscode), (COFFER_MSG_ADD, .add),
            (COFFER_MSG_COPY_MATCHING, .copyMatching), (COFFER_MSG_UPDATE, .update), (COFFER_MSG_DELETE, .delete),
            (COFFER_MSG_SUBSCRIBE, .subscribe), (COFFER_MSG_COPY_MATCHING_PAGE, .copyMatchingPage),
            (COFFER_MSG_WHOAMI, .whoami), (COFFER_MSG_AUTHORIZE, .authorize), (COFFER_MSG_WHOAMI_REPLY, .whoamiReply),
            (COFFER_MSG_AUTH_OPTIONS, .authOptions), (COFFER_MSG_AUTH_RESPONSE, .authResponse), (COFFER_MSG_LA_EVALUATE, .laEvaluate),
            (COFFER_MSG_LA_CAN_EVALUATE, .laCanEvaluate), (COFFER_MSG_AUTH_NEEDED, .authNeeded), (COFFER_MSG_AUTH_FEEDBACK, .authFeedback),
            (COFFER_MSG_AUTH_FEEDBACK_KIND, .authFeedbackKind),
            (COFFER_MSG_LA_RESULT, .laResult), (COFFER_MSG_BIO, .bio), (COFFER_MSG_PASSCODE_SYNC, .passcodeSync), (COFFER_MSG_REMOVE_PASSCODE, .removePasscode),
            (COFFER_MSG_ESCROW, .escrow), (COFFER_MSG_ESCROW_SECRET, .escrowSecret),
            (COFFER_MSG_BACKUP, .backup), (COFFER_MSG_BACKUP_SUMMARY, .backupSummary),
            (COFFER_MSG_CHECK, .check), (COFFER_MSG_CHECK_REPORT, .checkReport), (COFFER_MSG_CHECK_PAGE, .checkPage), (COFFER_MSG_KEY_CREATE, .keyCreate), (COFFER_MSG_DELEGATE, .delegate), (COFFER_MSG_PROTECTIONS, .protections), (COFFER_MSG_PROMPT_UNLOCK, .promptUnlock), (COFFER_MSG_PROMPT_READ, .promptRead), (COFFER_MSG_SUBSCRIBE_EVENTS, .subscribeEvents), (COFFER_MSG_PORTAL_SECRET, .portalSecret), (COFFER_MSG_PORTAL_SECRET_REPLY, .portalSecretReply), (COFFER_MSG_PROTECTIONS_REPLY, .protectionsReply), (COFFER_MSG_CHECK_REPORT_PAGE, .checkReportPage), (COFFER_MSG_ITEMS_PAGE_SKIPPING, .itemsPageSkipping), (COFFER_MSG_BIO_STATUS, .bioStatus),
            (COFFER_MSG_SYNC_SETUP, .syncSetup), (COFFER_MSG_SYNC_CIRCLE, .syncCircle), (COFFER_MSG_SYNC_STATUS, .syncStatus),
            (COFFER_MSG_SYNC_CONFLICTS, .syncConflicts), (COFFER_MSG_SYNC_CODE, .syncCode), (COFFER_MSG_SYNC_DEVICES, .syncDevices),
            (COFFER_MSG_SYNC_STATUS_REPLY, .syncStatusReply), (COFFER_MSG_SYNC_CONFLICTS_REPLY, .syncConflictsReply),
            (COFFER_MSG_FILES, .files), (COFFER_MSG_FILES_REPLY, .filesReply),
            (COFFER_MSG_PROMPTER, .prompter), (COFFER_MSG_PROMPTER_REPLY, .prompterReply),
            (COFFER_MSG_COUNTERS, .counters), (COFFER_MSG_COUNTERS_REPLY, .countersReply),
            (COFFER_MSG_KEY_SIGN, .keySign), (COFFER_MSG_KEY_SIGNATURE, .keySignature), (COFFER_MSG_SESSION, .session), (COFFER_MSG_NOTE_ACCESS, .noteAccess),
            (COFFER_MSG_OK, .ok), (COFFER_MSG_HELLO_REPLY, .helloReply), (COFFER_MSG_STATUS_REPLY, .statusReply),
            (COFFER_MSG_ITEMS, .items), (COFFER_MSG_COUNT, .count), (COFFER_MSG_ITEMS_PAGE, .itemsPage),
            (COFFER_MSG_EVENT, .event), (COFFER_MSG_ERROR, .error),
        ]
        for (value, type) in header { #expect(Int(value) == Int(type.rawValue), "\(type)") }
        // Every type the protocol module knows is in the header (a new message must be added to both).
        let known = Set((0...255).compactMap { MessageType(rawValue: UInt8($0)) }.map(\.rawValue))
        #expect(known == Set(header.map(\.1.rawValue)))
    }

    @Test func everyResultCodeHasItsHeaderConstant() {
        let header: [(Int32, SecStatus)] = [
            (COFFER_ERR_SUCCESS, .success), (COFFER_ERR_UNIMPLEMENTED, .unimplemented), (COFFER_ERR_IO, .io),
            (COFFER_ERR_PARAM, .param), (COFFER_ERR_ALLOCATE, .allocate), (COFFER_ERR_USER_CANCELED, .userCanceled),
            (COFFER_ERR_INTERNAL_COMPONENT, .internalComponent), (COFFER_ERR_NOT_AVAILABLE, .notAvailable),
            (COFFER_ERR_AUTH_FAILED, .authFailed), (COFFER_ERR_DUPLICATE_ITEM, .duplicateItem),
            (COFFER_ERR_ITEM_NOT_FOUND, .itemNotFound), (COFFER_ERR_INTERACTION_NOT_ALLOWED, .interactionNotAllowed),
            (COFFER_ERR_DECODE, .decode), (COFFER_ERR_MISSING_ENTITLEMENT, .missingEntitlement),
        ]
        for (value, status) in header { #expect(value == status.rawValue, "\(status)") }
        #expect(Set(SecStatus.allCases) == Set(header.map(\.1)))
    }
}
