/// What a front end's client did with an item the front end holds itself, not the keychain (the
/// Secret Service's `session` collection, kept in the front end's memory until it exits): NOTE_ACCESS
/// tells the agent, which writes it to the audit log under the client's identity.
public enum NotedAccess: UInt8, Sendable, CaseIterable {
    case add = 1, get = 2, update = 3, delete = 4, find = 5

    /// The audit log's operation name, the keychain's for the same act.
    public var operation: String {
        switch self {
        case .add: "add"
        case .get: "get"
        case .update: "update"
        case .delete: "delete"
        case .find: "find"
        }
    }
}
