import CofferCrypto
import CofferKeychain
import CofferModel
import Glibc

/// `coffer-bench fill-secret-service STATE_DIR N`: a keychain holding N items in the form the Secret
/// Service front end makes them (SecretServiceMapping.md): generic passwords in the `unsigned` group
/// (what an unsigned `secret-tool` sees), service `org.freedesktop.secrets`, a 128-bit hex account,
/// label `l`, the general attributes `service` = svc(i % 97) and `account` = acct(i) that
/// `secret-tool store service … account …` gives, in the `login` collection as `text/plain`;
/// secret `secret-i`. What gnome-keyring-fill.py writes for gnome-keyring, so that
/// contrib/bench/secret-service.sh times the same lookups against both providers.
func fillSecretService(stateDirectory: String, items: Int) throws {
    let kc = try Keychain(directory: stateDirectory, lockingStateDirectory: true)
    if kc.status.passcodeSet {
        var line: [UInt8] = []
        var byte: UInt8 = 0
        while read(0, &byte, 1) == 1 && byte != 0x0A { line.append(byte) }
        try kc.unlock(passcode: SecureBytes(consuming: &line))
    }
    var i = 1
    while i <= items {
        let batch = (i...min(items, i + 4999)).map { k in
            let account = String(repeating: "0", count: 32 - String(k, radix: 16).count) + String(k, radix: 16)
            return NewItem(itemClass: .genericPassword,
                           attributes: ["svce": .string("org.freedesktop.secrets"), "acct": .string(account), "labl": .string("l"),
                                        "agrp": .string("unsigned"), "pdmn": .string("ak"),
                                        GeneralAttributes.key("service"): .string("svc\(k % 97)"),
                                        GeneralAttributes.key("account"): .string("acct\(k)"),
                                        GeneralAttributes.key("coffer:collection"): .string("login"),
                                        GeneralAttributes.key("coffer:content-type"): .string("text/plain")],
                           secret: secret("secret-\(k)"))
        }
        try kc.add(contentsOf: batch, scope: .unrestricted)
        i += batch.count
    }
    kc.checkpoint()
}
