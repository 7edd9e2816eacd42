// See settings.gradle.kts. Inputs generated before Gradle runs (the workflow does both):
//   target/jvm/uniffi-kotlin   uniffi-bindgen generate --language kotlin (scripts/build-jar.sh)
//   target/android/jniLibs     cargo ndk -t arm64-v8a -t armeabi-v7a -t x86_64 -o target/android/jniLibs \
//                              build -p cc-app-server-ffi --profile release-mobile
plugins {
    id("com.android.library") version "8.7.3"
    id("org.jetbrains.kotlin.android") version "2.2.0"
}

val repoRoot = rootDir.resolve("../..")

android {
    namespace = "com.chainlesschain.appserver"
    compileSdk = 35
    defaultConfig {
        // java.nio.file.Path (AppServer.open(Path)) needs API 26; Wear OS 3+ is API 30.
        minSdk = 26
        testInstrumentationRunner = "androidx.test.runner.AndroidJUnitRunner"
        consumerProguardFiles("consumer-rules.pro")
    }
    sourceSets["main"].java.srcDirs(
        repoRoot.resolve("kotlin/src/main/kotlin"),
        repoRoot.resolve("bindings/kotlin/src/main/kotlin"),
        repoRoot.resolve("target/jvm/uniffi-kotlin"),
    )
    sourceSets["main"].jniLibs.srcDirs(repoRoot.resolve("target/android/jniLibs"))
    compileOptions {
        sourceCompatibility = JavaVersion.VERSION_17
        targetCompatibility = JavaVersion.VERSION_17
    }
    buildTypes {
        release { isMinifyEnabled = false }
    }
}

kotlin {
    compilerOptions {
        allWarningsAsErrors.set(true)
        jvmTarget.set(org.jetbrains.kotlin.gradle.dsl.JvmTarget.JVM_17)
    }
}

dependencies {
    // The AAR flavour of JNA carries libjnidispatch.so for every Android ABI.
    implementation("net.java.dev.jna:jna:5.17.0@aar")
    implementation("org.jetbrains.kotlinx:kotlinx-coroutines-android:1.10.2")
    // org.json is part of the Android platform: no dependency.
    androidTestImplementation("androidx.test.ext:junit:1.2.1")
    androidTestImplementation("androidx.test:runner:1.6.2")
    androidTestImplementation("org.jetbrains.kotlinx:kotlinx-coroutines-test:1.10.2")
}
