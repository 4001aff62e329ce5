/// Which class keys the keybag can hand out. The raw value is the STATUS_REPLY wire byte.
public enum LockState: UInt8, Sendable, CustomStringConvertible {
    /// Before the first unlock since start: only the Always classes.
    case boot = 0
    /// Locked after an unlock: AfterFirstUnlock and Always classes, not WhenUnlocked ones.
    case locked = 1
    /// Every class key is available.
    case unlocked = 2

    public var description: String {
        switch self {
        case .boot: "boot"
        case .locked: "locked"
        case .unlocked: "unlocked"
        }
    }
}

/// The keybag's lock state and passcode flag, read together (one critical section), so a decision
/// such as "lock only if a passcode is set and it is unlocked" sees one consistent moment.
public struct LockStatus: Sendable, Equatable {
    /// The lock state.
    public var lockState: LockState
    /// True once a passcode protects the non-Always classes.
    public var passcodeSet: Bool

    /// Makes a status value.
    public init(lockState: LockState, passcodeSet: Bool) {
        self.lockState = lockState
        self.passcodeSet = passcodeSet
    }
}
