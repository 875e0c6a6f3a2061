# sandboxrun base image: the login profile assigns PATH (as Debian's /etc/profile does).
PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
export PATH
