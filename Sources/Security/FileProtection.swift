#if os(Linux)
import CofferClient
import CofferCrypto
import CofferModel
import CofferSystem
public import Foundation
import Glibc

// Data Protection for files (issue #45) with Apple's own types: Foundation's `FileProtectionType` names the
// class, as on Apple platforms. On iOS a class belongs to each file and is set with
// `setAttributes([.protectionKey: …])` or `Data.write(to:options: .completeFileProtection…)`; on Linux the
// kernel's fscrypt encrypts a directory tree with one key, so a class belongs to a directory and every file
// in it (Coffer's protected directories: docs/protected-directories.md). Foundation's own calls cannot be
// redirected, so these are methods of their own, named after the ones they stand for:
//
//   Apple                                                                 here
//   fm.setAttributes([.protectionKey: FileProtectionType.complete], …)    fm.setProtection(.complete, ofDirectoryAtPath:)
//   fm.attributesOfItem(atPath:)[.protectionKey]                          fm.protection(ofItemAtPath:)
//   data.write(to:options: .completeFileProtectionUnlessOpen) (locked)   data.writeProtected(to:)
//
// Errors are NSErrors of NSOSStatusErrorDomain with the agent's status (errSecInteractionNotAllowed while
// the class is locked, errSecMissingEntitlement for an app that may not manage directories, …).

extension FileProtectionType {
    /// Coffer's class for this type; nil for a type Coffer has no class for.
    var cofferClass: FileProtection? {
        // (Foundation's type is not Equatable here: its raw values decide.)
        switch rawValue {
        case FileProtectionType.complete.rawValue: .complete
        case FileProtectionType.completeUnlessOpen.rawValue: .completeUnlessOpen
        case FileProtectionType.completeUntilFirstUserAuthentication.rawValue: .untilFirstUserAuthentication
        case FileProtectionType.none.rawValue: FileProtection.none
        default: nil
        }
    }

    /// Apple's type for Coffer's class.
    init(_ c: FileProtection) {
        switch c {
        case .complete: self = .complete
        case .completeUnlessOpen: self = .completeUnlessOpen
        case .untilFirstUserAuthentication: self = .completeUntilFirstUserAuthentication
        case .none: self = .none
        }
    }
}

/// The NSError a Foundation-style call throws for `f` (NSOSStatusErrorDomain, as Apple's Security errors).
private func nsError(_ f: SecFailure) -> NSError {
    NSError(domain: "NSOSStatusErrorDomain", code: Int(f.status), userInfo: [NSLocalizedDescriptionKey: f.detail])
}

/// `path` made absolute against the current directory, without trailing slashes.
private func absolutePath(_ path: String) -> String {
    var p = path.hasPrefix("/") ? path : FileManager.default.currentDirectoryPath + "/" + path
    while p.count > 1 && p.hasSuffix("/") { p.removeLast() }
    return p
}

extension FileManager {
    /// Makes the directory at `path` a protected directory of class `type` (Apple:
    /// `setAttributes([.protectionKey: type], ofItemAtPath:)`): an empty directory is protected in place, a
    /// non-empty one is migrated crash-safely. Every file in it then has the class. Throws an NSError of
    /// NSOSStatusErrorDomain: errSecParam for a type Coffer has no class for, errSecInteractionNotAllowed
    /// while the keychain is locked (for every class but `.none`), errSecDuplicateItem for a directory
    /// already protected, and the agent's reason for a directory it cannot protect (another filesystem,
    /// one without fscrypt, a symlink, another user's).
    public func setProtection(_ type: FileProtectionType, ofDirectoryAtPath path: String) throws {
        guard let c = type.cofferClass else {
            throw nsError(.param("\(type.rawValue) is not a file protection class Coffer has"))
        }
        let absolute = absolutePath(path)
        do {
            _ = try AgentSession.shared.run(retry: false) { (conn) throws(SecError) in try conn.protectDirectory(absolute, as: c) }
        } catch {
            throw nsError(error)
        }
    }

    /// The protection class of the file or directory at `path` (Apple: the `.protectionKey` attribute):
    /// that of the protected directory it is in (or is), nil when it is in none.
    public func protection(ofItemAtPath path: String) throws -> FileProtectionType? {
        let absolute = absolutePath(path)
        do {
            return try AgentSession.shared.run { (conn) throws(SecError) in try conn.fileProtection(ofPath: absolute) }.map(FileProtectionType.init)
        } catch {
            throw nsError(error)
        }
    }
}

extension Data {
    /// Writes these bytes as the new file `url` (Apple: `write(to:options: .completeFileProtectionUnlessOpen)`,
    /// which iOS lets an app do while the device is locked). While the file's directory is readable this is
    /// an atomic write, as `write(to:options: .atomic)`. While it is locked and the directory is
    /// complete-unless-open, the agent keeps the bytes sealed to the directory's drop key and writes the
    /// file in at the next unlock (at most `Data.maximumProtectedDropBytes`); any other locked directory
    /// throws errSecInteractionNotAllowed, and a file that exists already is not replaced while locked.
    public func writeProtected(to url: URL) throws {
        do {
            try write(to: url, options: .atomic)
            return
        } catch {
            // Locked: fscrypt refuses to create a file without the directory's key (ENOKEY). Anything else
            // is the write's own error.
            guard Self.isKeyUnavailable(error as NSError) else { throw error }
        }
        let directory = absolutePath(url.deletingLastPathComponent().path)
        let name = url.lastPathComponent
        let contents = withUnsafeBytes { SecureBytes(copying: $0) }
        defer { contents.wipe() }
        do {
            try AgentSession.shared.run(retry: false) { (conn) throws(SecError) in
                guard try conn.fileProtection(ofPath: directory) == .completeUnlessOpen else {
                    throw SecError(.interactionNotAllowed, "\(directory) is locked, and only a complete-unless-open directory takes new files while locked")
                }
                try conn.writeFile(contents, named: name, into: directory)
            }
        } catch {
            throw nsError(error)
        }
    }

    /// The most a file written while locked holds (what one request carries to the agent).
    public static let maximumProtectedDropBytes = AgentConnection.maximumPartedFileBytes

    /// Whether `error` (from Foundation's write) is fscrypt's "Required key not available" (ENOKEY).
    private static func isKeyUnavailable(_ error: NSError) -> Bool {
        if error.domain == NSPOSIXErrorDomain && error.code == Int(ENOKEY) { return true }
        // (Foundation keeps the underlying error as a Swift Error, which `as? NSError` does not match here.)
        if let underlying = error.userInfo[NSUnderlyingErrorKey] as? any Error { return isKeyUnavailable(underlying as NSError) }
        return false
    }
}
#endif
