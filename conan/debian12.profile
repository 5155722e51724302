# Debian 12 (amd64) with the packages scripts/bootstrap.sh installs: g++ 12, Boost 1.81
# (libboost1.81-dev) and LibTorch 1.13.1 (libtorch-dev). Conan takes Boost and LibTorch from
# the machine ([platform_requires]), so `conan create . -pr:a conan/debian12.profile` needs
# no network.
[settings]
os=Linux
arch=x86_64
compiler=gcc
compiler.version=12
compiler.libcxx=libstdc++11
compiler.cppstd=20
build_type=Release

[platform_requires]
boost/1.81.0
libtorch/1.13.1

[conf]
tools.cmake.cmaketoolchain:generator=Ninja
