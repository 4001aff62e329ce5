import CofferModel

/// Item k (from 1) of `coffer-bench fill-secret-service STATE_DIR N`, in the form the Secret Service
/// front end makes items (SecretServiceMapping.md): a generic password in the `unsigned` group (what
/// an unsigned `secret-tool` sees), service `org.freedesktop.secrets`, a 128-bit hex account, label
/// `l`, the general attributes `service` = svc(k % 97) and `account` = acct(k) that
/// `secret-tool store service … account …` gives, in the `login` collection as `text/plain`; secret
/// `secret-k`. What gnome-keyring-fill.py writes for gnome-keyring, so that
/// contrib/bench/secret-service.sh times the same lookups against both providers.
func secretServiceItem(_ k: Int) -> NewItem {
    let hex = String(k, radix: 16)
    let account = String(repeating: "0", count: 32 - hex.count) + hex
    return NewItem(itemClass: .genericPassword,
                   attributes: ["svce": .string("org.freedesktop.secrets"), "acct": .string(account), "labl": .string("l"),
                                "agrp": .string("unsigned"), "pdmn": .string("ak"),
                                GeneralAttributes.key("service"): .string("svc\(k % 97)"),
                                GeneralAttributes.key("account"): .string("acct\(k)"),
                                GeneralAttributes.key("coffer:collection"): .string("login"),
                                GeneralAttributes.key("coffer:content-type"): .string("text/plain")],
                   secret: secret("secret-\(k)"))
}
