import CofferCrypto
import CofferKeybag
import CofferKeychain
import CofferModel
import CofferTestSupport


/// A keychain in a fresh temporary directory.
final class Fixture {
    let dir = TemporaryDirectory("coffer-keychain")
    var keychain: Keychain
    /// The device key source (nil: the file key).
    var deviceKey: DeviceKeySource?

    init(passcode: String? = nil, deviceKey: DeviceKeySource? = nil) throws {
        self.deviceKey = deviceKey
        keychain = try Keychain(directory: dir.path, deviceKey: deviceKey, lockingStateDirectory: false)
        if let passcode { try keychain.setPasscode(current: nil, new: secret(passcode), kdf: testKDF) }
    }

    /// Simulates a restart: a new Keychain over the same files.
    func reboot() throws { keychain = try Keychain(directory: dir.path, deviceKey: deviceKey, lockingStateDirectory: false) }

    @discardableResult
    func addPassword(service: String, account: String, secret s: String, _ extra: Attributes = [:]) throws -> ItemResult {
        var attrs: Attributes = ["svce": .string(service), "acct": .string(account)]
        attrs.merge(extra) { $1 }
        return try keychain.add(NewItem(itemClass: .genericPassword, attributes: attrs, secret: secret(s)), scope: .unrestricted, returnPersistentRef: true)
    }

    func password(service: String, account: String) throws -> String? {
        let q = ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string(service), "acct": .string(account)], returnData: true)
        return text(try keychain.copyMatching(q, scope: .unrestricted).first?.data)
    }
}

