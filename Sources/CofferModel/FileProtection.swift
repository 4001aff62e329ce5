public import CofferCrypto

/// A protected directory's class (issue #45, FileProtectionFormat.md): when the kernel holds the
/// directory's fscrypt key. Apple's `FileProtectionType`, for a directory tree instead of a file.
public enum FileProtection: UInt8, Sendable, CaseIterable, Hashable {
    /// `FileProtectionType.complete`: the key is added at unlock and removed at lock.
    case complete = 1
    /// `FileProtectionType.completeUnlessOpen`: removed at lock; files held open stay usable.
    case completeUnlessOpen = 2
    /// `FileProtectionType.completeUntilFirstUserAuthentication`: added at the first unlock after the
    /// agent starts, kept across locks, removed by `coffer files lock --all`.
    case untilFirstUserAuthentication = 3
    /// `FileProtectionType.none`: added when the agent starts (the device key alone protects it).
    case none = 4

    /// The CLI's spelling (`coffer files protect --class`).
    public var cliName: String {
        switch self {
        case .complete: "complete"
        case .completeUnlessOpen: "complete-unless-open"
        case .untilFirstUserAuthentication: "until-first-auth"
        case .none: "none"
        }
    }

    /// The class named `cliName`, nil for another name.
    public init?(cliName: String) {
        guard let c = Self.allCases.first(where: { $0.cliName == cliName }) else { return nil }
        self = c
    }

    /// The keybag class whose class key wraps a directory key of this class (ThisDeviceOnly: a
    /// directory key opens one filesystem of this machine only).
    public var keybagClass: ProtectionClass {
        switch self {
        case .complete, .completeUnlessOpen: .whenUnlockedThisDeviceOnly
        case .untilFirstUserAuthentication: .afterFirstUnlockThisDeviceOnly
        case .none: .alwaysThisDeviceOnly
        }
    }
}

/// Whether the kernel holds a protected directory's key (GET_ENCRYPTION_KEY_STATUS).
public enum FileKeyState: UInt8, Sendable, Hashable {
    /// Not known (the filesystem could not be asked: not mounted, gone).
    case unknown = 0
    /// Absent: names are ciphertext, contents unreadable.
    case absent = 1
    /// Present: the directory reads as plain files.
    case present = 2
    /// Removed while files were open: those files stay usable until they close; the agent completes
    /// the removal then.
    case incompletelyRemoved = 3

    /// How `coffer files status` says it.
    public var text: String {
        switch self {
        case .unknown: "unknown"
        case .absent: "locked"
        case .present: "unlocked"
        case .incompletelyRemoved: "locking (files open)"
        }
    }
}

/// A process holding a file open (or its working directory) in a protected directory.
public struct FileHolder: Sendable, Hashable {
    /// Its process ID.
    public var pid: Int32
    /// Its command name (`/proc/PID/comm`).
    public var name: String

    public init(pid: Int32, name: String) {
        self.pid = pid
        self.name = name
    }
}

/// One protected directory as FILES_REPLY reports it.
public struct ProtectedDirectoryStatus: Sendable, Hashable {
    /// The directory's absolute path.
    public var path: String
    /// Its class.
    public var protection: FileProtection
    /// Its fscrypt key identifier (16 bytes; not secret: the directory's policy shows it to anyone).
    public var keyIdentifier: [UInt8]
    /// Whether the kernel holds its key now.
    public var keyState: FileKeyState
    /// Processes still holding files open after a lock (empty unless ``keyState`` is incompletely removed).
    public var holders: [FileHolder]
    /// What is wrong with it, if anything (e.g. its policy no longer names its key); empty: nothing.
    public var problem: String

    public init(path: String, protection: FileProtection, keyIdentifier: [UInt8], keyState: FileKeyState,
                holders: [FileHolder] = [], problem: String = "") {
        self.path = path
        self.protection = protection
        self.keyIdentifier = keyIdentifier
        self.keyState = keyState
        self.holders = holders
        self.problem = problem
    }
}

/// What a FILES request asks (WireProtocol.md, Protected directories).
public enum FilesOperation: Sendable {
    /// Make the directory at the absolute `path` a protected directory of class `protection`.
    case protect(path: String, protection: FileProtection)
    /// The status of every protected directory (nil) or of the one at `path`.
    case status(path: String?)
    /// Remove every protected directory's key now, whatever its class.
    case lockAll
    /// Write `data` as the file `name` of the CompleteUnlessOpen directory at `path`, also while locked.
    case drop(path: String, name: String, data: SecureBytes)
    /// One part of the file `name` of the CompleteUnlessOpen directory at `path`, written in several
    /// requests (a file larger than one request carries), also while locked.
    case dropPart(path: String, name: String, part: FileDropPart, data: SecureBytes)

    /// The longest path a FILES request carries (bytes of UTF-8; Linux's PATH_MAX less its NUL).
    public static let maximumPathBytes = 4095

    /// True if `path` is one a FILES request may carry: absolute, at most ``maximumPathBytes``, no NUL,
    /// no `.` or `..` component, no empty component and no trailing slash (but `/` itself).
    public static func isValidPath(_ path: String) -> Bool {
        let bytes = Array(path.utf8)
        guard bytes.first == UInt8(ascii: "/"), bytes.count <= maximumPathBytes, !bytes.contains(0) else { return false }
        if path == "/" { return true }
        let parts = path.split(separator: "/", omittingEmptySubsequences: false).dropFirst()
        return !parts.contains { $0.isEmpty || $0 == "." || $0 == ".." }
    }
}

/// One part of a file written while locked in several requests (FILES operation 5): the parts of one
/// `dropID`, numbered from 0, the last marked `final`, make one file, written when all are there.
public struct FileDropPart: Sendable, Equatable {
    /// The client's random 16-byte identifier of the file.
    public var dropID: [UInt8]
    public var index: UInt32
    public var final: Bool
    public init(dropID: [UInt8], index: UInt32, final: Bool) {
        self.dropID = dropID
        self.index = index
        self.final = final
    }
}
