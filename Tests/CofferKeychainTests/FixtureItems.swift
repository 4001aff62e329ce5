import CofferCrypto
import CofferModel

/// The items in the v1 state-directory fixtures (`Fixtures/v1-passcode`, `Fixtures/v1-nopasscode`),
/// written once by the Coffer of commit 912a3b3 (item format 1, keybag format 1) and kept to prove that
/// later formats migrate them without loss. Each fixture's `manifest.txt` lists the same items.
enum V1Fixture {
    /// The passcode of `v1-passcode` (Argon2id opsLimit 1, 64 MiB).
    static let passcode = "fixture passcode 1"

    /// The secret of item `n`: `length` deterministic bytes (not UTF-8 text on purpose).
    static func secretBytes(_ n: Int, _ length: Int) -> [UInt8] {
        (0..<length).map { UInt8(truncatingIfNeeded: n &* 31 &+ $0 &* 7 &+ 1) }
    }

    /// Secret lengths: empty, tiny, the 40-byte case, bucket edges and two large ones.
    static let lengths = [0, 1, 40, 63, 64, 100, 4096, 5000, 70000]

    struct Item {
        var n: Int
        var itemClass: ItemClass
        var attributes: Attributes
        var secret: [UInt8]
    }

    /// Every item: one generic password per protection class, then internet passwords of several
    /// classes (WhenPasscodeSetThisDeviceOnly only with a passcode).
    static func items(withPasscode: Bool) -> [Item] {
        var out: [Item] = []
        var n = 0
        let classes = ProtectionClass.allCases.filter { withPasscode || !$0.requiresPasscode }
        for c in classes {
            let attrs: Attributes = [
                "svce": .string("svc.\(c.shortCode)"), "acct": .string("alice"), "labl": .string("Label \(c.shortCode)"),
                "desc": .string("generic \(c.cliName)"), "icmt": .string("comment \(n)"),
                "gena": .data([1, 2, 3, UInt8(n)]), "pdmn": .string(c.shortCode),
            ]
            out.append(Item(n: n, itemClass: .genericPassword, attributes: attrs, secret: secretBytes(n, lengths[n % lengths.count])))
            n += 1
        }
        for c in classes {
            let attrs: Attributes = [
                "srvr": .string("\(c.shortCode).example.org"), "acct": .string("bob"), "ptcl": .string("htps"),
                "port": .integer(443), "path": .string("/login"), "labl": .string("Web \(c.shortCode)"),
                "pdmn": .string(c.shortCode),
            ]
            out.append(Item(n: n, itemClass: .internetPassword, attributes: attrs, secret: secretBytes(n, lengths[n % lengths.count])))
            n += 1
        }
        // Two items of one service (a search must return both) in AfterFirstUnlock and Always.
        for c in [ProtectionClass.afterFirstUnlock, .always] {
            let attrs: Attributes = ["svce": .string("shared"), "acct": .string("user\(n)"), "pdmn": .string(c.shortCode)]
            out.append(Item(n: n, itemClass: .genericPassword, attributes: attrs, secret: secretBytes(n, 70000)))
            n += 1
        }
        return out
    }
}
