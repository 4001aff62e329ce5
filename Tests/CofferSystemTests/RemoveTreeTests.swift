import CofferSystem
import CofferTestSupport
import Foundation
import Testing

/// `Files.removeTree` (an erase removes the sync clone with it): everything under the directory goes,
/// and a symbolic link inside is removed as a link, never followed.
struct RemoveTreeTests {
    let dir = TemporaryDirectory("coffer-rmtree")

    @Test func removesEverythingAndNeverFollowsALink() throws {
        let fm = FileManager.default
        let tree = dir.file("sync"), outside = dir.file("outside")
        try fm.createDirectory(atPath: tree + "/.git/objects/ab", withIntermediateDirectories: true)
        try fm.createDirectory(atPath: tree + "/records/x/00", withIntermediateDirectories: true)
        try fm.createDirectory(atPath: outside, withIntermediateDirectories: true)
        writeFileBytes(tree + "/.git/objects/ab/cd", [1, 2, 3])
        writeFileBytes(tree + "/records/x/00/1.record", [4])
        writeFileBytes(outside + "/keep", [5])
        try fm.createSymbolicLink(atPath: tree + "/records/link", withDestinationPath: outside)
        try Files.removeTree(tree)
        #expect(!fm.fileExists(atPath: tree))
        #expect(fileBytes(outside + "/keep") == [5], "the link's target was followed")
        try Files.removeTree(tree)   // already gone: no error
        // A link given as the tree itself is removed, not followed.
        try fm.createSymbolicLink(atPath: tree, withDestinationPath: outside)
        try Files.removeTree(tree)
        #expect(fileBytes(outside + "/keep") == [5] && (try? fm.destinationOfSymbolicLink(atPath: tree)) == nil)
    }
}
