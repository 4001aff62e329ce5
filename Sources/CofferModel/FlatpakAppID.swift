/// Flatpak's application-id grammar, shared by the identity code (an app id read from a sandbox's
/// `.flatpak-info`) and the desktop portal's secret backend (an app id the portal names).
public enum FlatpakAppID {
    /// Longest application id (Flatpak's own limit).
    public static let maximumBytes = 255

    /// Flatpak's rule for application ids: 3 or more dot-separated elements of `[A-Za-z0-9_-]`, none
    /// empty or starting with a digit, at most 255 bytes.
    public static func isValid(_ id: String) -> Bool {
        guard !id.isEmpty, id.utf8.count <= maximumBytes else { return false }
        let elements = id.utf8.split(separator: UInt8(ascii: "."), omittingEmptySubsequences: false)
        guard elements.count >= 3 else { return false }
        for e in elements {
            guard let first = e.first, !(UInt8(ascii: "0")...UInt8(ascii: "9")).contains(first) else { return false }
            for c in e {
                let ok = (UInt8(ascii: "a")...UInt8(ascii: "z")).contains(c) || (UInt8(ascii: "A")...UInt8(ascii: "Z")).contains(c)
                    || (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(c) || c == UInt8(ascii: "_") || c == UInt8(ascii: "-")
                guard ok else { return false }
            }
        }
        return true
    }
}
