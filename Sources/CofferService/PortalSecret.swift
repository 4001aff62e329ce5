package import CofferCrypto
package import CofferModel
import CofferKeychain

extension KeychainService {
    /// The item that holds a Flatpak app's portal secret (SecretServiceMapping.md, Portal): a generic
    /// password with this service and the app id as its account, in the app's `flatpak:APP_ID` group.
    package static let portalSecretService = "org.freedesktop.portal.Secret"
    /// Bytes of a portal secret the agent makes (the portal asks for at least 64).
    package static let portalSecretBytes = 64

    /// PORTAL_SECRET (WireProtocol.md, Portal secrets): the per-app secret of Flatpak app `appID`,
    /// made (64 random bytes, class WhenUnlocked) and stored on first use. Only for a caller whose
    /// manifest grants `portal-secret` (errSecMissingEntitlement otherwise, audited); `appID` must be
    /// a valid Flatpak application id (errSecParam). The search and the add run as the Flatpak app
    /// itself (its group only, under the `flatpak-callers` policy), so the backend reaches exactly this
    /// one item and no other item or group; both are audited with the app as the caller.
    package func portalSecret(appID: String, _ context: CallerContext) throws(SecError) -> SecureBytes {
        let backend = context.caller
        guard backend.mayServePortalSecrets else {
            gate.record(backend, operation: "portal-secret", group: nil, itemClass: nil, status: .missingEntitlement, reason: "not-entitled")
            throw SecError(.missingEntitlement, "the caller's manifest does not grant the portal-secret entitlement")
        }
        guard FlatpakAppID.isValid(appID) else { throw .param("the app id is not a valid Flatpak application id") }
        let group = CallerIdentity.flatpakGroupPrefix + appID
        let app = CallerIdentity(pid: backend.pid, uid: backend.uid, establishedBy: .flatpak(appID: appID), accessGroups: [group],
                                 executable: backend.executable, sessionID: backend.sessionID, session: backend.session)
        var acting = CallerContext(caller: app)
        let key: Attributes = ["svce": .string(Self.portalSecretService), "acct": .string(appID), "agrp": .string(group)]
        let query = ItemQuery(itemClass: .genericPassword, attributes: key, limit: .one, returnData: true)
        func existing() throws(SecError) -> SecureBytes? {
            do {
                return try search(query, &acting, nil) { (page) throws(SecError) in page.items.first?.data }
            } catch where error.status == .itemNotFound {
                return nil
            }
        }
        if let secret = try existing() { return secret }
        var attributes = key
        attributes["labl"] = .string("Portal secret of \(appID)")
        let made = SecureBytes.random(count: Self.portalSecretBytes)
        do {
            _ = try add(NewItem(itemClass: .genericPassword, attributes: attributes, secret: made), returning: Returning(), &acting, nil)
            return made
        } catch where error.status == .duplicateItem {
            // Another request made it first: that one is the app's secret.
            made.wipe()
            guard let secret = try existing() else { throw .itemNotFound("the portal secret vanished while it was made") }
            return secret
        }
    }
}
