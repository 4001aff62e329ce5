#!/usr/bin/env bash
# Locks the Coffer keybag (after its grace period) when the desktop session locks, by sending
# SIGUSR1 to the agent. Run it from your session's autostart:
#   ~/.config/autostart/coffer-lock.desktop: Exec=/usr/local/share/coffer/coffer-lock-on-screensaver.sh
# It listens for org.freedesktop.ScreenSaver / org.gnome.ScreenSaver ActiveChanged(true) on the
# session bus and for logind's Lock signal on the system bus.
set -eu
lock_agent() {
    systemctl --user kill -s USR1 coffer-agent.service 2>/dev/null || pkill -USR1 -u "$(id -u)" -x cofferd || true
}
{
    dbus-monitor --session "type='signal',interface='org.freedesktop.ScreenSaver',member='ActiveChanged'" \
                           "type='signal',interface='org.gnome.ScreenSaver',member='ActiveChanged'" &
    dbus-monitor --system "type='signal',interface='org.freedesktop.login1.Session',member='Lock'" &
    wait
} | while IFS= read -r line; do
    case "$line" in
        *"boolean true"*|*"member=Lock"*) lock_agent ;;
    esac
done
