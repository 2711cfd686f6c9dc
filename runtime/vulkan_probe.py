"""What the Vulkan devices on this machine are: subgroup size, shader features, shared memory.

A SPIR-V module is compiled for one subgroup size and one set of features (float16, int8, 8/16-bit
storage, ...). IREE's Python runtime cannot query a device's subgroup size, and a module built for
another subgroup size runs with no error and wrong results: measured, a module built for IREE's
`valhall4` target (subgroup 16) ran on lavapipe (subgroup 8) and was off by 1.18. The runtime asks
this probe first and refuses a device the module was not built for.

    for d in probe():                       # one VulkanDevice per vkEnumeratePhysicalDevices entry
        d.name, d.subgroup_size, d.supports_subgroup_size(16), d.shader_float16

ctypes and the standard library only (no torch, numpy or iree): it loads the Vulkan loader
(libvulkan.so.1), creates an instance with no layers or extensions, reads each physical device's
properties and features with vkGetPhysicalDeviceProperties2 / vkGetPhysicalDeviceFeatures2, and
destroys the instance. It reads properties only and never creates a logical device. The result is
cached per process; a failure (VulkanUnavailable) is not, so it is raised again on every call.

The structs below are written out field by field in vulkan_core.h's order (VkPhysicalDeviceLimits
included); `python -m llmc.runtime.vulkan_probe` prints each device as a JSON line.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import json
import sys

# The Vulkan loader's file name, as ctypes.CDLL takes it (a module-level name so tests can point it away).
if sys.platform == "win32":
    LIBVULKAN = "vulkan-1.dll"
elif sys.platform == "darwin":
    LIBVULKAN = "libvulkan.1.dylib"
else:
    LIBVULKAN = "libvulkan.so.1"

_INSTALL_HINT = "install libvulkan1 and a Vulkan driver (mesa-vulkan-drivers for the CPU driver lavapipe)"


class VulkanUnavailable(RuntimeError):
    """The Vulkan loader cannot be loaded or no instance can be created; the message says why."""


@dataclasses.dataclass(frozen=True)
class VulkanDevice:
    index: int  # order of vkEnumeratePhysicalDevices
    name: str  # VkPhysicalDeviceProperties.deviceName
    vendor_id: int
    device_type: str  # "integrated", "discrete", "virtual", "cpu", "other"
    api_version: str  # "1.3.230"
    subgroup_size: int  # VkPhysicalDeviceSubgroupProperties.subgroupSize (the default); 0 on a Vulkan 1.0 device
    min_subgroup_size: int  # VkPhysicalDeviceSubgroupSizeControlProperties; = subgroup_size if unavailable
    max_subgroup_size: int
    shader_float16: bool  # VkPhysicalDeviceVulkan12Features.shaderFloat16 (or ShaderFloat16Int8Features)
    shader_int8: bool
    shader_int16: bool  # VkPhysicalDeviceFeatures.shaderInt16
    shader_int64: bool
    shader_float64: bool
    storage_buffer_8bit: bool  # storageBuffer8BitAccess
    storage_buffer_16bit: bool  # storageBuffer16BitAccess
    max_compute_shared_memory: int  # VkPhysicalDeviceLimits.maxComputeSharedMemorySize (bytes)

    def supports_subgroup_size(self, n: int) -> bool:
        """Whether a module built for subgroup size n can run here (min <= n <= max)."""
        return self.min_subgroup_size <= n <= self.max_subgroup_size


# ---- Vulkan constants (vulkan_core.h) ----------------------------------------------------------

def _make_version(major: int, minor: int, patch: int = 0) -> int:
    return (major << 22) | (minor << 12) | patch


def _version_str(v: int) -> str:
    return f"{(v >> 22) & 0x7F}.{(v >> 12) & 0x3FF}.{v & 0xFFF}"


_VK_API_VERSION_1_1 = _make_version(1, 1)
_VK_API_VERSION_1_2 = _make_version(1, 2)
_VK_API_VERSION_1_3 = _make_version(1, 3)

_VK_SUCCESS = 0
_VK_INCOMPLETE = 5
_VK_RESULT_NAMES = {
    -1: "VK_ERROR_OUT_OF_HOST_MEMORY",
    -2: "VK_ERROR_OUT_OF_DEVICE_MEMORY",
    -3: "VK_ERROR_INITIALIZATION_FAILED",
    -6: "VK_ERROR_LAYER_NOT_PRESENT",
    -7: "VK_ERROR_EXTENSION_NOT_PRESENT",
    -9: "VK_ERROR_INCOMPATIBLE_DRIVER",
}

_ST_APPLICATION_INFO = 0
_ST_INSTANCE_CREATE_INFO = 1
_ST_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES = 49
_ST_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES = 51
_ST_PHYSICAL_DEVICE_FEATURES_2 = 1000059000
_ST_PHYSICAL_DEVICE_PROPERTIES_2 = 1000059001
_ST_PHYSICAL_DEVICE_SHADER_FLOAT16_INT8_FEATURES = 1000082000
_ST_PHYSICAL_DEVICE_16BIT_STORAGE_FEATURES = 1000083000
_ST_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES = 1000094000
_ST_PHYSICAL_DEVICE_8BIT_STORAGE_FEATURES = 1000177000
_ST_PHYSICAL_DEVICE_SUBGROUP_SIZE_CONTROL_PROPERTIES = 1000225000

_DEVICE_TYPES = {0: "other", 1: "integrated", 2: "discrete", 3: "virtual", 4: "cpu"}

# ---- structs -------------------------------------------------------------------------------------

_C_TYPES = {
    "uint8_t": ctypes.c_uint8,
    "uint32_t": ctypes.c_uint32,
    "int32_t": ctypes.c_int32,
    "float": ctypes.c_float,
    "size_t": ctypes.c_size_t,
    "char": ctypes.c_char,
    "void*": ctypes.c_void_p,
    "VkStructureType": ctypes.c_int32,
    "VkPhysicalDeviceType": ctypes.c_int32,
    "VkBool32": ctypes.c_uint32,
    "VkFlags": ctypes.c_uint32,
    "VkSampleCountFlags": ctypes.c_uint32,
    "VkShaderStageFlags": ctypes.c_uint32,
    "VkSubgroupFeatureFlags": ctypes.c_uint32,
    "VkDeviceSize": ctypes.c_uint64,
}


def _struct(name: str, decl: str, types: dict | None = None) -> type[ctypes.Structure]:
    """A ctypes Structure from C member declarations, one `type name[N];` per line, as vulkan_core.h has them."""
    known = {**_C_TYPES, **(types or {})}
    fields = []
    for line in decl.splitlines():
        if not line.strip():
            continue
        ctype, member = line.strip().rstrip(";").split()
        count = 1
        if "[" in member:
            member, n = member[:-1].split("[")
            count = int(n)
        t = known[ctype]
        fields.append((member, t * count if count > 1 else t))
    return type(name, (ctypes.Structure,), {"_fields_": fields})


def _bools(names: str) -> str:
    return "\n".join(f"VkBool32 {n};" for n in names.split())


_HEAD = "VkStructureType sType;\nvoid* pNext;\n"

VkApplicationInfo = _struct("VkApplicationInfo", _HEAD + """
    void* pApplicationName;
    uint32_t applicationVersion;
    void* pEngineName;
    uint32_t engineVersion;
    uint32_t apiVersion;
""")

VkInstanceCreateInfo = _struct("VkInstanceCreateInfo", _HEAD + """
    VkFlags flags;
    void* pApplicationInfo;
    uint32_t enabledLayerCount;
    void* ppEnabledLayerNames;
    uint32_t enabledExtensionCount;
    void* ppEnabledExtensionNames;
""")

VkExtensionProperties = _struct("VkExtensionProperties", """
    char extensionName[256];
    uint32_t specVersion;
""")

VkPhysicalDeviceLimits = _struct("VkPhysicalDeviceLimits", """
    uint32_t maxImageDimension1D;
    uint32_t maxImageDimension2D;
    uint32_t maxImageDimension3D;
    uint32_t maxImageDimensionCube;
    uint32_t maxImageArrayLayers;
    uint32_t maxTexelBufferElements;
    uint32_t maxUniformBufferRange;
    uint32_t maxStorageBufferRange;
    uint32_t maxPushConstantsSize;
    uint32_t maxMemoryAllocationCount;
    uint32_t maxSamplerAllocationCount;
    VkDeviceSize bufferImageGranularity;
    VkDeviceSize sparseAddressSpaceSize;
    uint32_t maxBoundDescriptorSets;
    uint32_t maxPerStageDescriptorSamplers;
    uint32_t maxPerStageDescriptorUniformBuffers;
    uint32_t maxPerStageDescriptorStorageBuffers;
    uint32_t maxPerStageDescriptorSampledImages;
    uint32_t maxPerStageDescriptorStorageImages;
    uint32_t maxPerStageDescriptorInputAttachments;
    uint32_t maxPerStageResources;
    uint32_t maxDescriptorSetSamplers;
    uint32_t maxDescriptorSetUniformBuffers;
    uint32_t maxDescriptorSetUniformBuffersDynamic;
    uint32_t maxDescriptorSetStorageBuffers;
    uint32_t maxDescriptorSetStorageBuffersDynamic;
    uint32_t maxDescriptorSetSampledImages;
    uint32_t maxDescriptorSetStorageImages;
    uint32_t maxDescriptorSetInputAttachments;
    uint32_t maxVertexInputAttributes;
    uint32_t maxVertexInputBindings;
    uint32_t maxVertexInputAttributeOffset;
    uint32_t maxVertexInputBindingStride;
    uint32_t maxVertexOutputComponents;
    uint32_t maxTessellationGenerationLevel;
    uint32_t maxTessellationPatchSize;
    uint32_t maxTessellationControlPerVertexInputComponents;
    uint32_t maxTessellationControlPerVertexOutputComponents;
    uint32_t maxTessellationControlPerPatchOutputComponents;
    uint32_t maxTessellationControlTotalOutputComponents;
    uint32_t maxTessellationEvaluationInputComponents;
    uint32_t maxTessellationEvaluationOutputComponents;
    uint32_t maxGeometryShaderInvocations;
    uint32_t maxGeometryInputComponents;
    uint32_t maxGeometryOutputComponents;
    uint32_t maxGeometryOutputVertices;
    uint32_t maxGeometryTotalOutputComponents;
    uint32_t maxFragmentInputComponents;
    uint32_t maxFragmentOutputAttachments;
    uint32_t maxFragmentDualSrcAttachments;
    uint32_t maxFragmentCombinedOutputResources;
    uint32_t maxComputeSharedMemorySize;
    uint32_t maxComputeWorkGroupCount[3];
    uint32_t maxComputeWorkGroupInvocations;
    uint32_t maxComputeWorkGroupSize[3];
    uint32_t subPixelPrecisionBits;
    uint32_t subTexelPrecisionBits;
    uint32_t mipmapPrecisionBits;
    uint32_t maxDrawIndexedIndexValue;
    uint32_t maxDrawIndirectCount;
    float maxSamplerLodBias;
    float maxSamplerAnisotropy;
    uint32_t maxViewports;
    uint32_t maxViewportDimensions[2];
    float viewportBoundsRange[2];
    uint32_t viewportSubPixelBits;
    size_t minMemoryMapAlignment;
    VkDeviceSize minTexelBufferOffsetAlignment;
    VkDeviceSize minUniformBufferOffsetAlignment;
    VkDeviceSize minStorageBufferOffsetAlignment;
    int32_t minTexelOffset;
    uint32_t maxTexelOffset;
    int32_t minTexelGatherOffset;
    uint32_t maxTexelGatherOffset;
    float minInterpolationOffset;
    float maxInterpolationOffset;
    uint32_t subPixelInterpolationOffsetBits;
    uint32_t maxFramebufferWidth;
    uint32_t maxFramebufferHeight;
    uint32_t maxFramebufferLayers;
    VkSampleCountFlags framebufferColorSampleCounts;
    VkSampleCountFlags framebufferDepthSampleCounts;
    VkSampleCountFlags framebufferStencilSampleCounts;
    VkSampleCountFlags framebufferNoAttachmentsSampleCounts;
    uint32_t maxColorAttachments;
    VkSampleCountFlags sampledImageColorSampleCounts;
    VkSampleCountFlags sampledImageIntegerSampleCounts;
    VkSampleCountFlags sampledImageDepthSampleCounts;
    VkSampleCountFlags sampledImageStencilSampleCounts;
    VkSampleCountFlags storageImageSampleCounts;
    uint32_t maxSampleMaskWords;
    VkBool32 timestampComputeAndGraphics;
    float timestampPeriod;
    uint32_t maxClipDistances;
    uint32_t maxCullDistances;
    uint32_t maxCombinedClipAndCullDistances;
    uint32_t discreteQueuePriorities;
    float pointSizeRange[2];
    float lineWidthRange[2];
    float pointSizeGranularity;
    float lineWidthGranularity;
    VkBool32 strictLines;
    VkBool32 standardSampleLocations;
    VkDeviceSize optimalBufferCopyOffsetAlignment;
    VkDeviceSize optimalBufferCopyRowPitchAlignment;
    VkDeviceSize nonCoherentAtomSize;
""")

VkPhysicalDeviceSparseProperties = _struct("VkPhysicalDeviceSparseProperties", _bools(
    "residencyStandard2DBlockShape residencyStandard2DMultisampleBlockShape residencyStandard3DBlockShape "
    "residencyAlignedMipSize residencyNonResidentStrict"
))

VkPhysicalDeviceProperties = _struct("VkPhysicalDeviceProperties", """
    uint32_t apiVersion;
    uint32_t driverVersion;
    uint32_t vendorID;
    uint32_t deviceID;
    VkPhysicalDeviceType deviceType;
    char deviceName[256];
    uint8_t pipelineCacheUUID[16];
    VkPhysicalDeviceLimits limits;
    VkPhysicalDeviceSparseProperties sparseProperties;
""", {"VkPhysicalDeviceLimits": VkPhysicalDeviceLimits, "VkPhysicalDeviceSparseProperties": VkPhysicalDeviceSparseProperties})

VkPhysicalDeviceProperties2 = _struct("VkPhysicalDeviceProperties2", _HEAD + """
    VkPhysicalDeviceProperties properties;
""", {"VkPhysicalDeviceProperties": VkPhysicalDeviceProperties})

VkPhysicalDeviceSubgroupProperties = _struct("VkPhysicalDeviceSubgroupProperties", _HEAD + """
    uint32_t subgroupSize;
    VkShaderStageFlags supportedStages;
    VkSubgroupFeatureFlags supportedOperations;
    VkBool32 quadOperationsInAllStages;
""")

VkPhysicalDeviceSubgroupSizeControlProperties = _struct("VkPhysicalDeviceSubgroupSizeControlProperties", _HEAD + """
    uint32_t minSubgroupSize;
    uint32_t maxSubgroupSize;
    uint32_t maxComputeWorkgroupSubgroups;
    VkShaderStageFlags requiredSubgroupSizeStages;
""")

VkPhysicalDeviceFeatures = _struct("VkPhysicalDeviceFeatures", _bools("""
    robustBufferAccess fullDrawIndexUint32 imageCubeArray independentBlend geometryShader
    tessellationShader sampleRateShading dualSrcBlend logicOp multiDrawIndirect
    drawIndirectFirstInstance depthClamp depthBiasClamp fillModeNonSolid depthBounds wideLines
    largePoints alphaToOne multiViewport samplerAnisotropy textureCompressionETC2
    textureCompressionASTC_LDR textureCompressionBC occlusionQueryPrecise pipelineStatisticsQuery
    vertexPipelineStoresAndAtomics fragmentStoresAndAtomics shaderTessellationAndGeometryPointSize
    shaderImageGatherExtended shaderStorageImageExtendedFormats shaderStorageImageMultisample
    shaderStorageImageReadWithoutFormat shaderStorageImageWriteWithoutFormat
    shaderUniformBufferArrayDynamicIndexing shaderSampledImageArrayDynamicIndexing
    shaderStorageBufferArrayDynamicIndexing shaderStorageImageArrayDynamicIndexing shaderClipDistance
    shaderCullDistance shaderFloat64 shaderInt64 shaderInt16 shaderResourceResidency
    shaderResourceMinLod sparseBinding sparseResidencyBuffer sparseResidencyImage2D
    sparseResidencyImage3D sparseResidency2Samples sparseResidency4Samples sparseResidency8Samples
    sparseResidency16Samples sparseResidencyAliased variableMultisampleRate inheritedQueries
"""))

VkPhysicalDeviceFeatures2 = _struct("VkPhysicalDeviceFeatures2", _HEAD + """
    VkPhysicalDeviceFeatures features;
""", {"VkPhysicalDeviceFeatures": VkPhysicalDeviceFeatures})

VkPhysicalDeviceVulkan11Features = _struct("VkPhysicalDeviceVulkan11Features", _HEAD + _bools("""
    storageBuffer16BitAccess uniformAndStorageBuffer16BitAccess storagePushConstant16
    storageInputOutput16 multiview multiviewGeometryShader multiviewTessellationShader
    variablePointersStorageBuffer variablePointers protectedMemory samplerYcbcrConversion
    shaderDrawParameters
"""))

VkPhysicalDeviceVulkan12Features = _struct("VkPhysicalDeviceVulkan12Features", _HEAD + _bools("""
    samplerMirrorClampToEdge drawIndirectCount storageBuffer8BitAccess
    uniformAndStorageBuffer8BitAccess storagePushConstant8 shaderBufferInt64Atomics
    shaderSharedInt64Atomics shaderFloat16 shaderInt8 descriptorIndexing
    shaderInputAttachmentArrayDynamicIndexing shaderUniformTexelBufferArrayDynamicIndexing
    shaderStorageTexelBufferArrayDynamicIndexing shaderUniformBufferArrayNonUniformIndexing
    shaderSampledImageArrayNonUniformIndexing shaderStorageBufferArrayNonUniformIndexing
    shaderStorageImageArrayNonUniformIndexing shaderInputAttachmentArrayNonUniformIndexing
    shaderUniformTexelBufferArrayNonUniformIndexing shaderStorageTexelBufferArrayNonUniformIndexing
    descriptorBindingUniformBufferUpdateAfterBind descriptorBindingSampledImageUpdateAfterBind
    descriptorBindingStorageImageUpdateAfterBind descriptorBindingStorageBufferUpdateAfterBind
    descriptorBindingUniformTexelBufferUpdateAfterBind descriptorBindingStorageTexelBufferUpdateAfterBind
    descriptorBindingUpdateUnusedWhilePending descriptorBindingPartiallyBound
    descriptorBindingVariableDescriptorCount runtimeDescriptorArray samplerFilterMinmax
    scalarBlockLayout imagelessFramebuffer uniformBufferStandardLayout shaderSubgroupExtendedTypes
    separateDepthStencilLayouts hostQueryReset timelineSemaphore bufferDeviceAddress
    bufferDeviceAddressCaptureReplay bufferDeviceAddressMultiDevice vulkanMemoryModel
    vulkanMemoryModelDeviceScope vulkanMemoryModelAvailabilityVisibilityChains
    shaderOutputViewportIndex shaderOutputLayer subgroupBroadcastDynamicId
"""))

# Before Vulkan 1.2 (1.1 for 16-bit storage) the same features live in extension structs.
VkPhysicalDevice16BitStorageFeatures = _struct("VkPhysicalDevice16BitStorageFeatures", _HEAD + _bools(
    "storageBuffer16BitAccess uniformAndStorageBuffer16BitAccess storagePushConstant16 storageInputOutput16"
))
VkPhysicalDevice8BitStorageFeatures = _struct("VkPhysicalDevice8BitStorageFeatures", _HEAD + _bools(
    "storageBuffer8BitAccess uniformAndStorageBuffer8BitAccess storagePushConstant8"
))
VkPhysicalDeviceShaderFloat16Int8Features = _struct("VkPhysicalDeviceShaderFloat16Int8Features", _HEAD + _bools(
    "shaderFloat16 shaderInt8"
))

# ---- function pointer types ---------------------------------------------------------------------

_VkResult = ctypes.c_int32
_P = ctypes.POINTER
_PFN_vkEnumerateInstanceVersion = ctypes.CFUNCTYPE(_VkResult, _P(ctypes.c_uint32))
_PFN_vkCreateInstance = ctypes.CFUNCTYPE(_VkResult, _P(VkInstanceCreateInfo), ctypes.c_void_p, _P(ctypes.c_void_p))
_PFN_vkDestroyInstance = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)
_PFN_vkEnumeratePhysicalDevices = ctypes.CFUNCTYPE(_VkResult, ctypes.c_void_p, _P(ctypes.c_uint32), _P(ctypes.c_void_p))
_PFN_vkGetPhysicalDeviceProperties = ctypes.CFUNCTYPE(None, ctypes.c_void_p, _P(VkPhysicalDeviceProperties))
_PFN_vkGetPhysicalDeviceFeatures = ctypes.CFUNCTYPE(None, ctypes.c_void_p, _P(VkPhysicalDeviceFeatures))
_PFN_vkGetPhysicalDeviceProperties2 = ctypes.CFUNCTYPE(None, ctypes.c_void_p, _P(VkPhysicalDeviceProperties2))
_PFN_vkGetPhysicalDeviceFeatures2 = ctypes.CFUNCTYPE(None, ctypes.c_void_p, _P(VkPhysicalDeviceFeatures2))
_PFN_vkEnumerateDeviceExtensionProperties = ctypes.CFUNCTYPE(
    _VkResult, ctypes.c_void_p, ctypes.c_char_p, _P(ctypes.c_uint32), _P(VkExtensionProperties)
)

# ---- the probe ----------------------------------------------------------------------------------


def _result_name(r: int) -> str:
    return _VK_RESULT_NAMES.get(r, f"VkResult {r}")


def _as_dict(s: ctypes.Structure) -> dict:
    """A struct's members (sType and pNext left out) as Python values: arrays as lists, names as str, UUIDs as hex."""
    out = {}
    for name, _ in s._fields_:
        if name in ("sType", "pNext"):
            continue
        v = getattr(s, name)
        if isinstance(v, bytes):  # a char array: ctypes stops at the NUL
            v = v.decode("utf-8", errors="replace")
        elif isinstance(v, ctypes.Array):
            v = bytes(v).hex() if v._type_ is ctypes.c_uint8 else list(v)
        elif isinstance(v, ctypes.Structure):
            continue  # nested structs (limits, sparseProperties, features) are reported as their own sections
        out[name] = v
    return out


def _chain(head: ctypes.Structure, *structs: ctypes.Structure) -> None:
    prev = head
    for s in structs:
        prev.pNext = ctypes.cast(ctypes.pointer(s), ctypes.c_void_p)
        prev = s


def _load(libname: str):
    try:
        lib = ctypes.CDLL(libname)
    except OSError as e:
        raise VulkanUnavailable(f"{libname} not found: {_INSTALL_HINT} ({e})") from None
    try:
        gipa = lib.vkGetInstanceProcAddr
    except AttributeError:
        raise VulkanUnavailable(f"{libname} has no vkGetInstanceProcAddr: it is not a Vulkan loader") from None
    gipa.restype = ctypes.c_void_p
    gipa.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    return lib, gipa


def _query(libname: str) -> list[dict]:
    """Every physical device's raw properties and features, one dict of sections per device.

    Sections are named like vulkaninfo's headings (VkPhysicalDeviceProperties, VkPhysicalDeviceLimits,
    VkPhysicalDeviceSubgroupProperties, VkPhysicalDeviceVulkan12Features, ...) and hold the struct's
    members by their C names; a section is absent where the device does not have the struct.
    "extensions" lists the device's extension names."""
    lib, gipa = _load(libname)

    def fn(instance, name: str, proto):
        addr = gipa(instance, name.encode())
        return proto(addr) if addr else None

    enumerate_version = fn(None, "vkEnumerateInstanceVersion", _PFN_vkEnumerateInstanceVersion)
    if enumerate_version is None:
        raise VulkanUnavailable(f"the Vulkan loader {libname} is Vulkan 1.0; 1.1 or newer is needed: {_INSTALL_HINT}")
    create_instance = fn(None, "vkCreateInstance", _PFN_vkCreateInstance)
    if create_instance is None:
        raise VulkanUnavailable(f"{libname} does not give vkCreateInstance")

    app_name = ctypes.create_string_buffer(b"llmc vulkan_probe")  # a local: alive until vkCreateInstance returns
    # Vulkan 1.3 asked for: a 1.1+ loader accepts any version and each device still reports its own.
    app = VkApplicationInfo(sType=_ST_APPLICATION_INFO, pApplicationName=ctypes.cast(app_name, ctypes.c_void_p),
                            apiVersion=_VK_API_VERSION_1_3)
    info = VkInstanceCreateInfo(sType=_ST_INSTANCE_CREATE_INFO, pApplicationInfo=ctypes.cast(ctypes.pointer(app), ctypes.c_void_p))
    instance = ctypes.c_void_p()
    r = create_instance(ctypes.byref(info), None, ctypes.byref(instance))
    if r != _VK_SUCCESS:
        if r == -9:  # VK_ERROR_INCOMPATIBLE_DRIVER: the loader found no driver (ICD) that can make an instance
            raise VulkanUnavailable(
                "vkCreateInstance failed with VK_ERROR_INCOMPATIBLE_DRIVER: the loader found no Vulkan driver (ICD); "
                "install one (mesa-vulkan-drivers for the CPU driver lavapipe)"
            )
        raise VulkanUnavailable(f"vkCreateInstance failed with {_result_name(r)}")
    try:
        return _query_instance(instance, fn)
    finally:
        destroy = fn(instance, "vkDestroyInstance", _PFN_vkDestroyInstance)
        if destroy is not None:
            destroy(instance, None)


def _query_instance(instance: ctypes.c_void_p, fn) -> list[dict]:
    enumerate_devices = fn(instance, "vkEnumeratePhysicalDevices", _PFN_vkEnumeratePhysicalDevices)
    get_props = fn(instance, "vkGetPhysicalDeviceProperties", _PFN_vkGetPhysicalDeviceProperties)
    get_feats = fn(instance, "vkGetPhysicalDeviceFeatures", _PFN_vkGetPhysicalDeviceFeatures)
    get_props2 = fn(instance, "vkGetPhysicalDeviceProperties2", _PFN_vkGetPhysicalDeviceProperties2)
    get_feats2 = fn(instance, "vkGetPhysicalDeviceFeatures2", _PFN_vkGetPhysicalDeviceFeatures2)
    enumerate_exts = fn(instance, "vkEnumerateDeviceExtensionProperties", _PFN_vkEnumerateDeviceExtensionProperties)
    if None in (enumerate_devices, get_props, get_feats, enumerate_exts):
        raise VulkanUnavailable("the Vulkan loader lacks a Vulkan 1.0 instance function")

    while True:  # the count can change between the two calls (VK_INCOMPLETE): ask again
        count = ctypes.c_uint32(0)
        r = enumerate_devices(instance, ctypes.byref(count), None)
        if r != _VK_SUCCESS:
            raise VulkanUnavailable(f"vkEnumeratePhysicalDevices failed with {_result_name(r)}")
        handles = (ctypes.c_void_p * max(count.value, 1))()
        r = enumerate_devices(instance, ctypes.byref(count), handles)
        if r == _VK_SUCCESS:
            break
        if r != _VK_INCOMPLETE:
            raise VulkanUnavailable(f"vkEnumeratePhysicalDevices failed with {_result_name(r)}")

    out = []
    for i in range(count.value):
        pd = handles[i]
        props = VkPhysicalDeviceProperties()
        get_props(pd, ctypes.byref(props))
        version = props.apiVersion
        exts = _device_extensions(pd, enumerate_exts)
        dev: dict = {}

        if version >= _VK_API_VERSION_1_1 and get_props2 is not None and get_feats2 is not None:
            p2 = VkPhysicalDeviceProperties2(sType=_ST_PHYSICAL_DEVICE_PROPERTIES_2)
            subgroup = VkPhysicalDeviceSubgroupProperties(sType=_ST_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES)
            p_chain = [subgroup]
            if version >= _VK_API_VERSION_1_3 or b"VK_EXT_subgroup_size_control" in exts:
                size_control = VkPhysicalDeviceSubgroupSizeControlProperties(sType=_ST_PHYSICAL_DEVICE_SUBGROUP_SIZE_CONTROL_PROPERTIES)
                p_chain.append(size_control)
            _chain(p2, *p_chain)
            get_props2(pd, ctypes.byref(p2))
            props = p2.properties

            f2 = VkPhysicalDeviceFeatures2(sType=_ST_PHYSICAL_DEVICE_FEATURES_2)
            if version >= _VK_API_VERSION_1_2:
                f_chain = [VkPhysicalDeviceVulkan11Features(sType=_ST_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES),
                           VkPhysicalDeviceVulkan12Features(sType=_ST_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES)]
            else:  # Vulkan 1.1: 16-bit storage is core, the rest are extensions
                f_chain = [VkPhysicalDevice16BitStorageFeatures(sType=_ST_PHYSICAL_DEVICE_16BIT_STORAGE_FEATURES)]
                if b"VK_KHR_8bit_storage" in exts:
                    f_chain.append(VkPhysicalDevice8BitStorageFeatures(sType=_ST_PHYSICAL_DEVICE_8BIT_STORAGE_FEATURES))
                if b"VK_KHR_shader_float16_int8" in exts:
                    f_chain.append(VkPhysicalDeviceShaderFloat16Int8Features(sType=_ST_PHYSICAL_DEVICE_SHADER_FLOAT16_INT8_FEATURES))
            _chain(f2, *f_chain)
            get_feats2(pd, ctypes.byref(f2))
            features = f2.features
            for s in p_chain + f_chain:
                dev[type(s).__name__] = _as_dict(s)
        else:  # a Vulkan 1.0 device: no subgroup properties, no 8/16-bit features that we may query
            features = VkPhysicalDeviceFeatures()
            get_feats(pd, ctypes.byref(features))

        dev["VkPhysicalDeviceProperties"] = _as_dict(props)
        dev["VkPhysicalDeviceLimits"] = _as_dict(props.limits)
        dev["VkPhysicalDeviceSparseProperties"] = _as_dict(props.sparseProperties)
        dev["VkPhysicalDeviceFeatures"] = _as_dict(features)
        dev["extensions"] = sorted(e.decode() for e in exts)
        out.append(dev)
    return out


def _device_extensions(pd, enumerate_exts) -> set[bytes]:
    while True:
        count = ctypes.c_uint32(0)
        if enumerate_exts(pd, None, ctypes.byref(count), None) != _VK_SUCCESS:
            return set()
        arr = (VkExtensionProperties * max(count.value, 1))()
        r = enumerate_exts(pd, None, ctypes.byref(count), arr)
        if r == _VK_SUCCESS:
            return {arr[i].extensionName for i in range(count.value)}
        if r != _VK_INCOMPLETE:
            return set()


def _device(index: int, raw: dict) -> VulkanDevice:
    p = raw["VkPhysicalDeviceProperties"]
    feats = raw["VkPhysicalDeviceFeatures"]
    sub = raw.get("VkPhysicalDeviceSubgroupProperties", {}).get("subgroupSize", 0)
    size_control = raw.get("VkPhysicalDeviceSubgroupSizeControlProperties", {})

    def feature(name: str, *sections: str) -> bool:
        return any(bool(raw.get(s, {}).get(name)) for s in sections)

    return VulkanDevice(
        index=index,
        name=p["deviceName"],
        vendor_id=p["vendorID"],
        device_type=_DEVICE_TYPES.get(p["deviceType"], "other"),
        api_version=_version_str(p["apiVersion"]),
        subgroup_size=sub,
        min_subgroup_size=size_control.get("minSubgroupSize", sub),
        max_subgroup_size=size_control.get("maxSubgroupSize", sub),
        shader_float16=feature("shaderFloat16", "VkPhysicalDeviceVulkan12Features", "VkPhysicalDeviceShaderFloat16Int8Features"),
        shader_int8=feature("shaderInt8", "VkPhysicalDeviceVulkan12Features", "VkPhysicalDeviceShaderFloat16Int8Features"),
        shader_int16=bool(feats["shaderInt16"]),
        shader_int64=bool(feats["shaderInt64"]),
        shader_float64=bool(feats["shaderFloat64"]),
        storage_buffer_8bit=feature("storageBuffer8BitAccess", "VkPhysicalDeviceVulkan12Features", "VkPhysicalDevice8BitStorageFeatures"),
        storage_buffer_16bit=feature("storageBuffer16BitAccess", "VkPhysicalDeviceVulkan11Features", "VkPhysicalDevice16BitStorageFeatures"),
        max_compute_shared_memory=raw["VkPhysicalDeviceLimits"]["maxComputeSharedMemorySize"],
    )


@functools.lru_cache(maxsize=None)
def _probe(libname: str) -> tuple[VulkanDevice, ...]:
    return tuple(_device(i, raw) for i, raw in enumerate(_query(libname)))  # lru_cache never caches an exception


def probe() -> list[VulkanDevice]:
    """The Vulkan physical devices, in vkEnumeratePhysicalDevices order (cached per process and loader name).

    Raises VulkanUnavailable(str) with a one-line reason if the loader (LIBVULKAN) cannot be loaded or
    no instance can be created, e.g. 'libvulkan.so.1 not found: install libvulkan1 and a Vulkan driver
    (mesa-vulkan-drivers for the CPU driver lavapipe)'. An instance with no physical device gives []."""
    return list(_probe(LIBVULKAN))


def main() -> int:
    try:
        devices = probe()
    except VulkanUnavailable as e:
        print(f"vulkan_probe: {e}", file=sys.stderr)
        return 1
    if not devices:
        print("vulkan_probe: the Vulkan instance has no physical device", file=sys.stderr)
        return 1
    for d in devices:
        print(json.dumps(dataclasses.asdict(d)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
