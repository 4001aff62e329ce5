/// What `coffer check` asks the agent (the CHECK request).
public enum CheckOperation: Sendable, Equatable {
    /// Verify every row whose keys are in memory; change nothing.
    case verify
    /// Verify, and move every row that cannot be opened (it fails authentication, or its class or
    /// protection does not match its row) into the quarantine table.
    case quarantine
    /// List the quarantined rows.
    case listQuarantine
    /// Put the quarantined row with this persistent reference back among the items.
    case restore(persistentRef: [UInt8])
}

/// One row `coffer check` found wrong, or one quarantined row.
public struct CheckFinding: Sendable, Equatable {
    /// What is wrong with it. Codes are part of the wire protocol: never renumbered.
    public enum Reason: UInt8, Sendable, Equatable, CaseIterable {
        /// Its attributes or secret fail authentication (altered, forged, or sealed under a key the
        /// keybag no longer holds).
        case authentication = 1
        /// Its primary-key hash or blind-index entries are not those its attributes give.
        case index = 2
        /// Its access group is missing or not a string.
        case group = 3
        /// Its protection class, reference or item class is invalid, or does not match its attributes.
        case itemClass = 4

        /// The word `coffer check` prints.
        public var name: String {
            switch self {
            case .authentication: "authentication"
            case .index: "index"
            case .group: "group"
            case .itemClass: "class"
            }
        }
    }

    /// The row's persistent reference (16 bytes; may be another length in a damaged row).
    public var persistentRef: [UInt8]
    /// What is wrong.
    public var reason: Reason
    /// True if the row is in the quarantine table (moved by this request, or listed).
    public var quarantined: Bool
    /// A sentence for people (no attribute values, no secrets).
    public var detail: String

    /// A finding.
    public init(persistentRef: [UInt8], reason: Reason, quarantined: Bool, detail: String) {
        self.persistentRef = persistentRef
        self.reason = reason
        self.quarantined = quarantined
        self.detail = detail
    }
}

/// The answer to a CHECK request.
public struct CheckReport: Sendable, Equatable {
    /// Rows verified (their keys were in memory).
    public var checked: UInt32
    /// Rows not verified because their class key is locked away.
    public var skipped: UInt32
    /// The rows found wrong (verify, quarantine), the quarantined rows (list), the restored row (restore).
    public var findings: [CheckFinding]

    /// Where the next page starts (a paged check); 0 when this report reaches the end.
    public var nextCursor: UInt64

    /// A report.
    public init(checked: UInt32, skipped: UInt32, findings: [CheckFinding], nextCursor: UInt64 = 0) {
        self.checked = checked
        self.skipped = skipped
        self.findings = findings
        self.nextCursor = nextCursor
    }
}
