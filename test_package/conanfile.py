# SPDX-License-Identifier: BSD-3-Clause
# Builds a small program against the torchloom package with find_package(torchloom) and runs
# it: it makes a TorchScript model, loads it with a runner and checks the runner's output.
import os

from conan import ConanFile
from conan.tools.build import can_run
from conan.tools.cmake import CMake, cmake_layout


class TorchloomTestConan(ConanFile):
    settings = "os", "arch", "compiler", "build_type"
    generators = "CMakeToolchain"

    def requirements(self):
        self.requires(self.tested_reference_str)

    def layout(self):
        cmake_layout(self)

    def build(self):
        cmake = CMake(self)
        cmake.configure()
        cmake.build()

    def test(self):
        if can_run(self):
            binary = os.path.join(self.cpp.build.bindir, "test_package")
            self.run(f"{binary} {os.path.join(self.build_folder, 'model.pt')}", env="conanrun")
