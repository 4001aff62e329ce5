import CofferKeychain
import CofferModel
import CofferPolicy
import Logging

/// Items stored before access groups were enforced are in `coffer.default`, a group every process of
/// the user could read. They move to the shared group `unsigned`, which keeps exactly that visibility
/// (every caller without a signed identity, and the shell helper, whose manifest the install script
/// signs with `unsigned` as its second group). Signed apps do not see them unless their manifest lists
/// `unsigned`.
///
/// One keychain update per class, each a single transaction (a crash leaves a class wholly moved or
/// not at all). Classes whose keys are not available yet are moved at a later unlock; the run is
/// idempotent and costs one index lookup per class once nothing is left to move.
enum LegacyGroups {
    static func migrate(_ keychain: Keychain, logger: Logger) {
        var moved = 0
        for cls in ItemClass.allCases {
            let query = ItemQuery(itemClass: cls, attributes: ["agrp": .string(AccessPolicy.legacyGroup)], limit: .all)
            do {
                moved += try keychain.update(query, ItemChanges(attributes: ["agrp": .string(AccessPolicy.unsignedGroup)]),
                                             scope: .unrestricted)
            } catch where error.status == .itemNotFound || error.status == .interactionNotAllowed {
                continue
            } catch {
                logger.warning("items of the old default access group could not be moved to 'unsigned'",
                               metadata: ["class": "\(cls.rawValue)", "status": "\(error.status.name)", "reason": "\(error.message)"])
            }
        }
        if moved > 0 {
            logger.notice("migrated", metadata: ["what": "access groups: \(moved) items moved from '\(AccessPolicy.legacyGroup)' to '\(AccessPolicy.unsignedGroup)'"])
        }
    }
}
