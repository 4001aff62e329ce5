import CofferClient
import CofferCrypto
import CofferModel
import CofferSystem

/// GnuPG passphrases in the keychain: generic-password items with service `gnupg` and account =
/// gpg-agent's cache id (`n/KEYGRIP` for an OpenPGP key, `s/…` for an ssh key, `u/…` user cache),
/// in this app's own access group (no group is named: the agent picks the caller's first).
///
/// Any failure — the agent unreachable, the keychain locked, a prompt refused — means "not stored":
/// the person is asked as if Coffer were not there. At most one line goes to standard error, naming
/// the error, never a passphrase or an attribute value.
final class PassphraseStore {
    static let service = "gnupg"
    private let socketPath: String
    private var connection: AgentConnection?
    private var unreachable = false
    private var reported = false
    /// Who asks the person when an item needs authentication (the wrapped pinentry), if anyone.
    var authenticationDelegate: (any AuthenticationDelegate)? {
        didSet { connection?.authenticationDelegate = authenticationDelegate }
    }

    init(socket: String?) {
        socketPath = AgentConnection.socketPath(explicit: socket)
    }

    private func connect() -> AgentConnection? {
        if let connection { return connection }
        guard !unreachable else { return nil }
        do {
            let c = try AgentConnection(path: socketPath, clientName: "pinentry-coffer")
            c.authenticationDelegate = authenticationDelegate
            if authenticationDelegate == nil {
                // Nobody can be asked: such items fail at once instead of waiting for a prompt.
                try c.setAuthenticationOptions(AuthenticationOptions(noUserInterface: true))
            }
            connection = c
            return c
        } catch {
            unreachable = true
            report(error)
            return nil
        }
    }

    private func query(_ account: String, returnData: Bool) -> ItemQuery {
        ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string(Self.service), "acct": .string(account)],
                  limit: returnData ? .one : .all, returnData: returnData)
    }

    enum Lookup {
        case found(SecureBytes)
        case notFound
        /// The keychain cannot answer now (unreachable, locked, the prompt refused).
        case unavailable
    }

    /// The stored passphrase for `account`, if the keychain can give it now.
    func lookup(_ account: String) -> Lookup {
        guard let c = connect() else { return .unavailable }
        do {
            guard let data = try c.copyMatching(query(account, returnData: true)).first?.data, data.count > 0 else { return .notFound }
            return .found(data)
        } catch {
            if error.status == .itemNotFound { return .notFound }
            report(error)
            return .unavailable
        }
    }

    /// Stores `secret` for `account` (replacing what is there); false if the keychain refused.
    @discardableResult
    func save(_ account: String, _ secret: SecureBytes, label: String) -> Bool {
        guard let c = connect() else { return false }
        var attrs: Attributes = ["svce": .string(Self.service), "acct": .string(account)]
        if !label.isEmpty { attrs["labl"] = .string(label) }
        do {
            _ = try c.add(NewItem(itemClass: .genericPassword, attributes: attrs, secret: secret))
            return true
        } catch where error.status == .duplicateItem {
            do {
                _ = try c.update(query(account, returnData: false), ItemChanges(secret: secret))
                return true
            } catch {
                report(error)
                return false
            }
        } catch {
            report(error)
            return false
        }
    }

    /// Deletes the passphrase stored for `account`, if any.
    func delete(_ account: String) {
        guard let c = connect() else { return }
        do {
            _ = try c.delete(query(account, returnData: false))
        } catch {
            if error.status != .itemNotFound { report(error) }
        }
    }

    private func report(_ error: SecError) {
        guard !reported else { return }
        reported = true
        StandardStreams.printError("pinentry-coffer: keychain not used: \(error.description)")
    }
}
