#!/usr/bin/python3
# One client process reading many secrets at once (contrib/bench/secret-service.sh): on the session
# bus's org.freedesktop.secrets, a plain session, then the timed part: one Service.SearchItems of
# every item (no attributes) and one Service.GetSecrets of the first COUNT unlocked items it found.
# Prints the timed part's µs; fails unless COUNT secrets came back, each a `secret-…` value.
#
#   bulk.py COUNT
import sys
import time

import dbus

count = int(sys.argv[1])
bus = dbus.bus.BusConnection(dbus.bus.BUS_SESSION)
service = dbus.Interface(bus.get_object('org.freedesktop.secrets', '/org/freedesktop/secrets', introspect=False),
                         'org.freedesktop.Secret.Service')
_, session = service.OpenSession('plain', dbus.String('', variant_level=1))
t0 = time.perf_counter()
unlocked, _ = service.SearchItems(dbus.Dictionary({}, signature='ss'))
secrets = service.GetSecrets(unlocked[:count], session, timeout=600)
t1 = time.perf_counter()
if len(secrets) != count or not all(bytes(s[2]).startswith(b'secret-') for s in secrets.values()):
    sys.exit('bulk.py: %d secrets for %d items asked (%d found)' % (len(secrets), count, len(unlocked)))
print(round((t1 - t0) * 1e6))
