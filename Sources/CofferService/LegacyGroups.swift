package import CofferKeychain
import CofferModel
import CofferPolicy
import CofferSystem
package import Logging

/// Items stored before access groups were enforced are in `coffer.default`, a group every process of
/// the user could read. They move to the shared group `unsigned`, which keeps exactly that visibility
/// (every caller without a signed identity, and the shell helper, whose manifest the install script
/// signs with `unsigned` as its second group). Signed apps do not see them unless their manifest lists
/// `unsigned`.
///
/// One keychain update per class, each a single transaction (a crash leaves a class wholly moved or
/// not at all). Classes whose keys are not available yet are moved at a later unlock; the run is
/// idempotent and costs one index lookup per class once nothing is left to move.
package enum LegacyGroups {
    package static func migrate(_ keychain: Keychain, logger: Logger) {
        var moved = 0
        let changes = ItemChanges(attributes: ["agrp": .string(AccessPolicy.unsignedGroup)])
        for cls in ItemClass.allCases {
            let legacy: Attributes = ["agrp": .string(AccessPolicy.legacyGroup)]
            do {
                // Items with an access control were never in the old group (access controls came later),
                // but the keychain library can put them there: they are left alone (moving one would
                // need its authentication), and everything else moves in one transaction per class.
                let found = try keychain.copyMatching(ItemQuery(itemClass: cls, attributes: legacy, limit: .all, returnAttributes: true,
                                                                returnPersistentRef: true), scope: .unrestricted)
                let protected = found.filter { $0.attributes?[AccessControl.attributeName] != nil }
                if protected.isEmpty {
                    moved += try keychain.update(ItemQuery(itemClass: cls, attributes: legacy, limit: .all), changes, scope: .unrestricted)
                } else {
                    for item in found where item.attributes?[AccessControl.attributeName] == nil {
                        guard let ref = item.persistentRef else { continue }
                        moved += try keychain.update(ItemQuery(limit: .all, persistentRef: ref), changes, scope: .unrestricted)
                    }
                }
            } catch where error.status == .itemNotFound || error.status == .interactionNotAllowed {
                continue
            } catch {
                logger.warning("items of the old default access group could not be moved to 'unsigned'",
                               metadata: ["class": "\(cls.rawValue)", "status": "\(error.status.name)", "reason": "\(error.message)"])
            }
        }
        if moved > 0 {
            // Reading and rewriting every old item leaves the unlocking connection thread's malloc
            // arena holding megabytes it no longer uses (at 10,000 items the agent's RSS doubled, 14 to
            // 30 MiB, for good): hand the free pages back once, after the one-off migration.
            ThisProcess.releaseFreeHeap()
            logger.notice("migrated", metadata: ["what": "access groups: \(moved) items moved from '\(AccessPolicy.legacyGroup)' to '\(AccessPolicy.unsignedGroup)'"])
        }
    }
}
