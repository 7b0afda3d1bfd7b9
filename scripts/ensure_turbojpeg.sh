#!/bin/sh
# Installs libturbojpeg0 when we are root on Debian/Ubuntu and it is missing; otherwise
# says how, and fastload falls back to OpenCV. Never fails the build.
if ldconfig -p 2>/dev/null | grep -q 'libturbojpeg\.so'; then
    exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "fastload: installing libturbojpeg0 with apt-get (fast JPEG decoding)"
    # Debian (and newer Ubuntu) call it libturbojpeg0, older Ubuntu releases libturbojpeg.
    (apt-get update -qq && { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libturbojpeg0 \
        || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libturbojpeg; }) >/dev/null 2>&1 \
        || echo "fastload: apt-get install libturbojpeg0 failed; JPEGs will be decoded with OpenCV"
else
    echo "fastload: libturbojpeg not found; JPEGs will be decoded with OpenCV."
    echo "          For faster decoding: sudo apt-get install libturbojpeg0 (Debian/Ubuntu; older Ubuntu: libturbojpeg)"
fi
exit 0
