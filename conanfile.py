# SPDX-License-Identifier: BSD-3-Clause
# Conan 2 recipe for torchloom, a header-only library. The package holds what torchloom's own
# `cmake --install` installs (headers, the CMake package, the licence) and nothing else; a
# consumer finds it with find_package(torchloom), whose config finds Torch and Boost.
#
# LibTorch and Boost are usually provided by the machine: declare them in the profile's
# [platform_requires] (conan/debian12.profile does so for Debian 12's packages):
#     conan create . -pr:a conan/debian12.profile
import re

from conan import ConanFile
from conan.tools.build import check_min_cppstd
from conan.tools.cmake import CMake, CMakeToolchain, cmake_layout
from conan.tools.files import load


class TorchloomConan(ConanFile):
    name = "torchloom"
    license = "BSD-3-Clause"
    description = ("Compose a PyTorch model runner at compile time from policies: loader, "
                   "model-init hook, CUDA stream and weight residency")
    topics = ("pytorch", "libtorch", "inference", "aotinductor", "torchscript", "header-only")
    package_type = "header-library"
    settings = "os", "arch", "compiler", "build_type"
    no_copy_source = True
    exports_sources = "CMakeLists.txt", "LICENSE", "cmake/*", "include/*"

    def set_version(self):
        # One version: CMakeLists.txt's project(VERSION) (a test ties version.hpp to it).
        text = load(self, self.recipe_folder + "/CMakeLists.txt")
        self.version = re.search(r"project\(torchloom VERSION ([0-9.]+)", text).group(1)

    def layout(self):
        cmake_layout(self)

    def requirements(self):
        # Headers of both are part of torchloom's interface; Boost >= 1.77 for Describe.
        self.requires("libtorch/[>=1.13 <3]")
        self.requires("boost/[>=1.77 <2]")

    def validate(self):
        check_min_cppstd(self, 20)

    def package_id(self):
        self.info.clear()

    def generate(self):
        tc = CMakeToolchain(self)
        for option in ("BUILD_TESTS", "BUILD_BENCHMARKS", "BUILD_EXAMPLES", "HEADER_TESTS"):
            tc.cache_variables["TORCHLOOM_" + option] = False
        tc.cache_variables["TORCHLOOM_INSTALL"] = True
        # Conan's place for licences: cmake.install() puts LICENSE there.
        tc.cache_variables["CMAKE_INSTALL_DOCDIR"] = "licenses"
        tc.generate()

    def build(self):
        cmake = CMake(self)
        cmake.configure()

    def package(self):
        cmake = CMake(self)
        cmake.install()

    def package_info(self):
        self.cpp_info.bindirs = []
        self.cpp_info.libdirs = []
        # Consumers use torchloom's own CMake config (it finds Torch and Boost, which Conan
        # cannot describe when they come from the platform), not one made by CMakeDeps.
        self.cpp_info.set_property("cmake_find_mode", "none")
        self.cpp_info.builddirs = ["lib/cmake/torchloom"]
