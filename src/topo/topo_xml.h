// NCCL topology XML <-> System. The format is the one NCCL_TOPO_DUMP_FILE writes and cloud
// vendors publish (Azure NDv4/NDv5 topo files):
//
//   <system version="1">
//     <cpu numaid="0" affinity="..." arch="x86_64" vendor="GenuineIntel" familyid="6" modelid="143">
//       <pci busid="0000:16:00.0" class="0x060400" link_speed="32.0 GT/s PCIe" link_width="16">
//         <pci busid="0000:18:00.0" class="0x030200" ...>
//           <gpu dev="0" sm="90" rank="0" gdr="1">
//             <nvlink target="0000:05:00.0" count="5" tclass="0x068000"/>
//           </gpu>
//         </pci>
//         <pci busid="0000:19:00.0" class="0x020000" ...>
//           <nic><net name="mlx5_0" dev="0" speed="400000" port="1" guid="0x..." gdr="1"/></nic>
//         </pci>
//       </pci>
//     </cpu>
//   </system>
//
// A <pci> of class 0x03xxxx without a <gpu> child (as in Azure's files, meant to be merged
// with what NCCL detects) is still a GPU, of unknown generation; all NVSwitches collapse
// into one switch node, as in NCCL.
#pragma once

#include "topo/system.h"
#include "topo/xml.h"

namespace loom::topo {

// Builds and finalizes a System; throws kInvalidArgument naming the element at fault.
System systemFromXml(const XmlNode& root);

// Loom's view in the same format (what NCCL_TOPO_DUMP_FILE receives).
XmlNode systemToXml(const System& sys);

// NCCL_TOPO_FILE semantics: the file wins; what detection found and the file does not
// say is added (attributes the file leaves unset, devices the file does not list, GPU
// NVLinks when the file lists none for that GPU). Devices are matched by PCI bus id,
// CPUs by numaid, ports by name.
XmlNode mergeXml(XmlNode file, const XmlNode& detected);

}  // namespace loom::topo
