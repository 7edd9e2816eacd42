// The Android/Wear AAR of CC App Server: the same Kotlin SDK and generated sources as the JVM jar
// (kotlin/src/main/kotlin, bindings/kotlin, the uniffi glue generated into target/jvm/uniffi-kotlin),
// with the native library per ABI from cargo-ndk under target/android/jniLibs.
// Built by .github/workflows/android.yml; this machine has no Android SDK/NDK (see README).
pluginManagement {
    repositories {
        google()
        mavenCentral()
        gradlePluginPortal()
    }
}
dependencyResolutionManagement {
    repositories {
        google()
        mavenCentral()
    }
}
rootProject.name = "cc-app-server-android"
