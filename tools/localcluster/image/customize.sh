#!/bin/sh
# Turns a fresh Debian/Ubuntu root file system into a local-cluster "VM" image.
# Runs inside the root file system: in a chroot (debootstrap path) or as a RUN step (registry path).
set -eu

# Every VM gets its own SSH host keys, generated at first boot.
rm -f /etc/ssh/ssh_host_*
cat >/etc/systemd/system/ssh-host-keys.service <<'UNIT'
[Unit]
Description=Generate SSH host keys unique to this VM
Before=ssh.service
ConditionPathExists=!/etc/ssh/ssh_host_ed25519_key

[Service]
Type=oneshot
ExecStart=/usr/bin/ssh-keygen -A

[Install]
WantedBy=ssh.service
UNIT
mkdir -p /etc/systemd/system/ssh.service.wants
ln -sf ../ssh-host-keys.service /etc/systemd/system/ssh.service.wants/ssh-host-keys.service

# Key-only SSH, as on a GCE image.
cat >/etc/ssh/sshd_config.d/10-localcluster.conf <<'CONF'
PasswordAuthentication no
PermitRootLogin no
CONF

# Units that cannot work in a container.
for unit in systemd-udevd.service systemd-udevd-control.socket systemd-udevd-kernel.socket \
            systemd-udev-trigger.service getty@tty1.service console-getty.service \
            systemd-modules-load.service systemd-remount-fs.service; do
    ln -sf /dev/null "/etc/systemd/system/$unit"
done

rm -f /etc/hostname /etc/machine-id /var/lib/dbus/machine-id
touch /etc/machine-id
apt-get clean
rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/log/*.log
