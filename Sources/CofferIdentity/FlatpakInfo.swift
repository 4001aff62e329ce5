import CofferModel

/// The part of Flatpak's `/.flatpak-info` (a GLib key file written by `flatpak run` into every
/// sandbox) that identity needs: the `name` key of the `[Application]` group.
package enum FlatpakInfo {
    /// Largest `.flatpak-info` read (64 KiB; real ones are a few hundred bytes).
    package static let maximumBytes = 64 << 10
    /// Longest application id (Flatpak's own limit).
    package static let maximumAppIDBytes = FlatpakAppID.maximumBytes

    /// The app id of an `[Application]` group's `name=` key, nil if there is none or it is not a
    /// valid Flatpak application id. A runtime's file (`[Runtime]` only) has no app id.
    package static func appID(from bytes: [UInt8]) -> String? {
        guard bytes.count <= maximumBytes, let text = String(validating: bytes, as: UTF8.self) else { return nil }
        var group: Substring?
        for rawLine in text.split(separator: "\n", omittingEmptySubsequences: true) {
            let line = rawLine.trimmingWhitespace()
            if line.isEmpty || line.hasPrefix("#") { continue }
            if line.hasPrefix("[") {
                guard line.hasSuffix("]") else { return nil }
                group = line.dropFirst().dropLast()
                continue
            }
            guard group == "Application", let eq = line.firstIndex(of: "=") else { continue }
            guard line[..<eq].trimmingWhitespace() == "name" else { continue }
            let value = String(line[line.index(after: eq)...].trimmingWhitespace())
            return isValidAppID(value) ? value : nil
        }
        return nil
    }

    /// Flatpak's rule for application ids (``FlatpakAppID``).
    package static func isValidAppID(_ id: String) -> Bool { FlatpakAppID.isValid(id) }
}

extension Substring {
    fileprivate func trimmingWhitespace() -> Substring {
        var s = self
        while let f = s.first, f == " " || f == "\t" || f == "\r" { s = s.dropFirst() }
        while let l = s.last, l == " " || l == "\t" || l == "\r" { s = s.dropLast() }
        return s
    }
}
