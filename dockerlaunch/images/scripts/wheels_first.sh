#!/bin/sh
# Run in the image (train.Dockerfile, the tests): the lock's CUDA libraries win in every import order. The wheels'
# library folders (site-packages/nvidia/*/lib) go at the top of /etc/ld.so.conf, before its include of
# ld.so.conf.d, so ldconfig prefers them over any system toolkit's copies whatever that one's file is called (an
# nvidia/cuda base's /usr/local/cuda holds its own, older copies: its cuBLAS 13.1 lacks what TE's core needs); a
# library asked for by soname before torch has loaded the wheel's copy then gets the wheel's. TE's loader opens
# cuDNN, NVRTC and cuRAND by path, from <LIB>_HOME first: the Dockerfile points those at the wheels.
set -eu
site=$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
conf=/etc/ld.so.conf
touch "$conf"
{
  echo "# dockerlaunch: the lock's CUDA libraries first (wheels_first.sh)"
  if [ -d "$site/nvidia" ]; then find "$site/nvidia" -mindepth 2 -maxdepth 3 -type d -name lib | sort; fi
  echo "# dockerlaunch: end"
  sed '/^# dockerlaunch: the lock/,/^# dockerlaunch: end$/d' "$conf"
} > "$conf.new"
mv "$conf.new" "$conf"
ldconfig
